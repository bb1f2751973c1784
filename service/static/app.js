// The search page: words or a photo → gallery photos and video moments (filtered, paged, each opening larger with
// its nearest captions, "open original" and "more like this"), an image → ranked (and, with a decoder, generated)
// captions, a sentence → paraphrases. Everything it shows comes from the /v1 API through api.js. A search by words
// or by a gallery item lives in the URL (?q=…&folder=…&page=2&open=ID): Back, reload and a shared link restore it.
import { ApiError, auth, fileURL, imageURL, readiness, requestJSON, videoURL } from "./api.js";

const $ = (id) => document.getElementById(id);
const el = {
  status: $("status"), error: $("error"), results: $("results"),
  keyForm: $("key-form"), keyInput: $("api-key"), keyHint: $("key-hint"),
  textForm: $("text-form"), query: $("query"), queryNote: $("query-note"), searchButton: $("search-button"),
  toggles: [...document.querySelectorAll(".tools .toggle, #duplicates-toggle")], filtersCount: $("filters-count"),
  paraphraseToggle: $("paraphrase-toggle"), clearFilters: $("clear-filters"),
  captionsToggle: $("captions-toggle"), dialogCaptionsTitle: $("detail-captions-title"),
  k: $("k"), subtract: $("subtract"), minScore: $("min-score"), folder: $("folder"), takenAfter: $("taken-after"),
  takenBefore: $("taken-before"), media: $("media"), mode: $("mode"), sort: $("sort"),
  duplicatesForm: $("duplicates"), duplicatesThreshold: $("duplicates-threshold"),
  drop: $("drop"), file: $("image-file"), similarDrop: $("similar-drop"), similarFile: $("similar-file"),
  paraphraseForm: $("paraphrase-form"), paraphraseText: $("paraphrase-text"), paraphraseNote: $("paraphrase-note"),
  dialog: $("detail"), dialogTitle: $("detail-title"), dialogPosition: $("detail-position"),
  dialogImage: $("detail-image"), dialogVideo: $("detail-video"), dialogFacts: $("detail-facts"),
  dialogOriginal: $("detail-original"), dialogLike: $("detail-like"), dialogCaptions: $("detail-captions"),
  dialogError: $("detail-error"), dialogClose: $("detail-close"), dialogPrevious: $("detail-previous"),
  dialogNext: $("detail-next"),
};

const K_CHOICES = [5, 10, 20, 50, 100];
const DEFAULT_K = 10;
const THUMBNAIL = 256;
const LARGE = 640;
const DETAIL_CAPTIONS = 5;

const FORMATS = "JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC or AVIF";
const SCORE_RANGE = { cosine: [-1, 1], order: [null, 0] };
// the score from which an uploaded photo's first hit is the same picture (its embedding, up to decoding noise)
const SAME_PICTURE = { cosine: 0.995, order: -0.005 };
// the URL's parameter for each search option, in the URL's order
const URL_OPTIONS = [["media", "media"], ["folder", "folder"], ["after", "taken_after"], ["before", "taken_before"],
                     ["minus", "subtract"], ["min", "min_score"], ["sort", "sort"]];
// what the page calls the API's fields, in its messages
const FIELD_NAMES = { text: "Search text", k: "Per page", offset: "Page", min_score: "Min score", folder: "Folder",
                      taken_after: "Taken after", taken_before: "Taken before", media: "Show", subtract: "Leave out",
                      image_id: "Gallery item", image: "Image", mode: "Match",
                      sort: "Order", threshold: "Similarity" };
// a text search's match modes (the API's `mode`; "" sends none: the API's default, by meaning)
const MODES = ["hybrid", "keyword"];
const modeOf = (value) => (MODES.includes(value) ? value : undefined);

// strong: the relevance at which a hit is a strong match (/readyz's strong_relevance; null: hits have no relevance)
const config = { ready: false, decoder: false, captions: 0, keyRequired: false, maxK: 100, maxText: 1000, images: null,
                 videos: null, strong: null, similarity: "cosine" };
let action = null;            // AbortController of the search whose results the page is waiting for
let releases = [];            // revoke() of every blob: URL the results show
let shown = null;             // the results on screen: {query, hits, more, strongMatch}
let detailAction = null;
let detailIndex = -1;         // the result the detail view shows: its index in shown.hits
let quietClose = false;       // the detail view closes for a new search, or because the URL says so

// --- small helpers ---------------------------------------------------------------------------------------------

function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("data-") || name.startsWith("aria-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const score = (value) => value.toFixed(3);
const k = () => Number(el.k.value) || DEFAULT_K;
const isAbort = (err) => err && err.name === "AbortError";
const isMoment = (hit) => hit.media === "video";
const capital = (text) => text.charAt(0).toUpperCase() + text.slice(1);
const number = (n) => n.toLocaleString("en");
// "1 photo", "2 photos", "1 video moment"
const count = (n, one, many = `${one}s`) => `${number(n)} ${n === 1 ? one : many}`;

function message(err) {
  if (!(err instanceof ApiError)) return `Unexpected error: ${err.message || err}`;
  if (err.status === 422 && err.errors.length) {          // a field the API refused: named as the page names it
    return err.errors.map((e) => {
      const field = FIELD_NAMES[(e.loc || []).at(-1)];
      const text = String(e.msg || "invalid").replace(/^Value error, /, "");
      return field ? `${field}: ${text}` : text;
    }).join(" ");
  }
  return err.summary;
}

function showError(err) {
  el.error.textContent = message(err);
  el.error.hidden = false;
}

function clearError() {
  el.error.hidden = true;
  el.error.textContent = "";
}

function releaseImages() {
  releases.forEach((revoke) => revoke());
  releases = [];
}

// Starts a new action: the previous one is cancelled, so late answers never overwrite newer results.
function begin(label) {
  action?.abort();
  action = new AbortController();
  clearError();
  releaseImages();
  shown = null;
  el.results.setAttribute("aria-busy", "true");
  el.results.replaceChildren(h("p", { class: "loading", text: label }));
  return action.signal;
}

function end(signal, err) {
  if (signal.aborted) return;           // a newer action owns the results now
  el.results.setAttribute("aria-busy", "false");
  if (err) {
    el.results.replaceChildren();
    showError(err);
  }
}

async function showImage(img, id, size, signal) {
  try {
    const { url, revoke } = await imageURL(id, size, signal);
    releases.push(revoke);
    img.src = url;
  } catch (err) {
    if (!isAbort(err)) img.alt = `${img.alt} (${message(err)})`;
  }
}

// After a search the first result is in view: on a phone, or with a panel open, the page moves down to it.
function revealResults() {
  const first = el.results.querySelector(".hit") || el.results.firstElementChild;
  if (!first) return;
  const box = first.getBoundingClientRect();
  if (box.top >= 0 && box.bottom <= window.innerHeight) return;
  const smooth = !matchMedia("(prefers-reduced-motion: reduce)").matches;
  el.results.scrollIntoView({ block: "start", behavior: smooth ? "smooth" : "auto" });
}

// --- readiness and the API key ---------------------------------------------------------------------------------

function setControls(enabled) {
  el.searchButton.disabled = !enabled;
  for (const [input, zone] of [[el.file, el.drop], [el.similarFile, el.similarDrop]]) {
    input.disabled = !enabled;
    zone.classList.toggle("disabled", !enabled);
  }
}

function setScoreRange(similarity) {
  const [low, high] = SCORE_RANGE[similarity] || [null, null];
  if (low !== null) el.minScore.min = String(low);
  if (high !== null) el.minScore.max = String(high);
}

// a <select>'s value, adding the option first when it is not there (a folder named in a URL, before the list loads)
function choose(select, value, text = value) {
  if (value && ![...select.options].some((o) => o.value === value)) select.append(h("option", { value, text }));
  select.value = value;
}

async function loadFolders() {
  try {
    const { folders } = await requestJSON("v1/folders");
    const chosen = el.folder.value;
    el.folder.replaceChildren(h("option", { value: "", text: "All folders" }),
      ...folders.map((f) => h("option", {
        value: f.folder, text: `${f.folder === "." ? "(top folder)" : f.folder} (${f.images})` })));
    choose(el.folder, chosen);
  } catch (err) {
    // the folder filter stays at "All folders"; a missing key is asked for by api.js
  }
}

function fillK(maxK) {
  const choices = K_CHOICES.filter((v) => v <= maxK);
  if (!choices.includes(maxK) && maxK < K_CHOICES.at(-1)) choices.push(maxK);
  const selected = choices.includes(DEFAULT_K) ? DEFAULT_K : choices.at(-1);
  el.k.replaceChildren(...choices.map((v) => h("option", { value: String(v), text: String(v), selected: v === selected })));
}

function readyText(ready) {
  const photos = ready.photos ?? ready.images;
  const media = [count(photos, "photo")];
  if (ready.videos) media.push(`${count(ready.videos, "video")} (${count(ready.moments, "moment")})`);
  return `Ready: ${media.join(", ")}, ${count(ready.captions, "caption")}` +
    (config.decoder ? ", caption generator on" : "");
}

function configure(ready) {
  config.ready = true;
  config.decoder = Boolean(ready.decoder);
  config.keyRequired = Boolean(ready.api_key_required);
  config.maxK = ready.max_k || 100;
  config.maxText = ready.max_text_chars || config.maxText;
  config.images = ready.images;
  config.videos = ready.videos;
  config.strong = ready.strong_relevance ?? null;
  config.similarity = ready.similarity || "cosine";
  el.query.maxLength = config.maxText;
  el.paraphraseText.maxLength = config.maxText;
  fillK(config.maxK);
  el.status.textContent = readyText(ready);
  el.paraphraseToggle.hidden = !config.decoder;
  // an index without a caption corpus has no captions to rank: captions for an image (unless a decoder writes
  // them) and a result's nearest captions are not offered
  config.captions = ready.captions ?? 0;
  el.captionsToggle.hidden = !config.captions && !config.decoder;
  setScoreRange(ready.similarity);
  setControls(true);
  if (config.keyRequired && !auth.key) {
    askForKey("This service needs an API key for searches.");
    restore({ run: false });
  } else {
    loadFolders();
    restore();
  }
}

async function connect() {
  setControls(false);
  fillK(100);
  for (;;) {
    let ready;
    try {
      ready = await readiness();
    } catch (err) {
      el.status.textContent = "Cannot reach the service; retrying…";
      await sleep(2000);
      continue;
    }
    if (ready.ok) return configure(ready.body);
    const status = String(ready.body.status || "");
    if (status.startsWith("error")) {
      el.status.textContent = "The service could not load its model or index.";
      showError(new ApiError(ready.status, ready.body.detail || status));
      return;
    }
    el.status.textContent = `Loading the model and index… (${ready.body.detail || status})`;
    await sleep(1000);
  }
}

// Shows the key form with the API's reason. The focus moves to it unless the user has typed into another field: a
// 401 can arrive while they type their next query, and taking the focus then would send their Enter to this form.
function askForKey(detail) {
  auth.key = "";
  el.keyHint.textContent = detail;
  el.keyForm.hidden = false;
  const active = document.activeElement;
  const typing = active instanceof HTMLInputElement && active !== el.keyInput && active.value !== "";
  if (!typing) el.keyInput.focus();
}

auth.onUnauthorized = askForKey;

el.keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  auth.key = el.keyInput.value.trim();
  el.keyInput.value = "";
  el.keyForm.hidden = true;
  clearError();
  el.query.focus();
  loadFolders();
  if (!shown && location.search) restore();        // the search the URL holds, now with the key
});

// --- the folding panels: filters, search with a photo, captions for an image, paraphrases --------------------------

for (const toggle of el.toggles) {
  toggle.addEventListener("click", () => {
    const open = toggle.getAttribute("aria-expanded") !== "true";
    toggle.setAttribute("aria-expanded", String(open));
    $(toggle.getAttribute("aria-controls")).hidden = !open;
  });
}

// --- the search: its options, the URL that holds it ----------------------------------------------------------------

// The options the filter panel sets, as the API takes them; sent as typed (the API says what is wrong with a value).
function refinements() {
  const options = {};
  if (el.media.value) options.media = el.media.value;
  if (el.folder.value) options.folder = el.folder.value;
  if (el.takenAfter.value) options.taken_after = el.takenAfter.value;
  if (el.takenBefore.value) options.taken_before = el.takenBefore.value;
  const subtract = el.subtract.value.split(",").map((w) => w.trim()).filter(Boolean);
  if (subtract.length) options.subtract = subtract;
  if (el.minScore.value.trim() !== "") options.min_score = Number(el.minScore.value);
  if (el.sort.value) options.sort = el.sort.value;
  return options;
}

function showOptions(options, perPage) {
  el.media.value = options.media || "";
  choose(el.folder, options.folder || "");
  el.takenAfter.value = options.taken_after || "";
  el.takenBefore.value = options.taken_before || "";
  el.subtract.value = (options.subtract || []).join(", ");
  el.minScore.value = options.min_score ?? "";
  el.sort.value = options.sort || "";
  choose(el.k, String(perPage));
  countFilters();
}

function countFilters() {
  const n = Object.keys(refinements()).length;
  el.filtersCount.textContent = n ? String(n) : "";
  el.filtersCount.setAttribute("aria-label", n ? `${count(n, "filter")} on` : "");
}

for (const control of [el.media, el.folder, el.takenAfter, el.takenBefore, el.subtract, el.minScore, el.sort]) {
  control.addEventListener("input", countFilters);
  control.addEventListener("change", countFilters);
}

// "Clear filters": the controls back to none, and the search on screen run again without them (its results and
// its URL: no `media=video` left behind)
el.clearFilters.addEventListener("click", () => {
  showOptions({}, k());
  const query = shown?.query;
  if (query && query.kind !== "upload") search({ ...query, k: k(), offset: 0, options: refinements() });
});

// The URL of a search (none for an uploaded photo's), with the result the detail view shows.
function urlOf(query, open = null) {
  const params = new URLSearchParams();
  if (query?.kind === "text") {
    params.set("q", query.text);
    if (query.mode) params.set("match", query.mode);
  }
  else if (query?.kind === "like") params.set("like", String(query.id));
  else return location.pathname;
  for (const [param, name] of URL_OPTIONS) {
    const value = query.options[name];
    if (value !== undefined) params.set(param, Array.isArray(value) ? value.join(", ") : String(value));
  }
  if (query.k !== DEFAULT_K) params.set("k", String(query.k));
  const page = Math.floor(query.offset / query.k) + 1;
  if (page > 1) params.set("page", String(page));
  if (open !== null) params.set("open", String(open));
  return `?${params.toString().replace(/\+/g, "%20")}`;          // spaces as %20: "?q=a%20cat"
}

// The search the URL holds (null when none), the options it sets and the result to open.
function fromURL() {
  const params = new URLSearchParams(location.search);
  const options = {};
  for (const [param, name] of URL_OPTIONS) {
    const value = params.get(param);
    if (value === null || value.trim() === "") continue;
    if (name === "subtract") options[name] = value.split(",").map((w) => w.trim()).filter(Boolean);
    else if (name === "min_score") options[name] = Number(value);
    else options[name] = value;
  }
  const perPage = Math.min(Math.max(Math.floor(Number(params.get("k"))) || DEFAULT_K, 1), config.maxK);
  const page = Math.max(Math.floor(Number(params.get("page"))) || 1, 1);
  const base = { k: perPage, offset: (page - 1) * perPage, options };
  const text = params.get("q");
  const like = params.get("like");
  let query = null;
  if (text !== null && text.trim()) {
    query = { kind: "text", text: text.slice(0, config.maxText), mode: modeOf(params.get("match")), ...base };
  }
  else if (like !== null && /^\d+$/.test(like)) query = { kind: "like", id: Number(like), ...base };
  const open = /^\d+$/.test(params.get("open") || "") ? Number(params.get("open")) : null;
  return { query, open, options, perPage, cut: text !== null && text.length > config.maxText };
}

// Sets the URL: `push` makes a new history entry (Back returns to the one before), `replace` changes this one.
function setURL(url, mode, state = null) {
  if (mode === "none") return;
  const same = url === (location.search || location.pathname);
  if (mode === "push" && !same) history.pushState(state, "", url);
  else history.replaceState(state, "", url);
}

// Shows what the URL says: its search (run unless it is already on screen) and its open result.
function restore({ run = true } = {}) {
  const { query, open, options, perPage, cut } = fromURL();
  if (query) {                              // a URL without a search (an upload's) leaves the controls as they are
    showOptions(options, perPage);
    el.query.value = query.kind === "text" ? query.text : "";
    if (query.kind === "text") el.mode.value = query.mode || "";
  }
  if (cut) noteQuery(`The search box takes up to ${number(config.maxText)} characters; the rest was left out.`);
  if (!query) {
    closeDetail(true);
    if (shown) {
      action?.abort();
      shown = null;
      releaseImages();
      el.results.replaceChildren();
    }
    if (run && !el.results.hasChildNodes()) showStart();
    return;
  }
  if (shown && shown.query.kind !== "upload" && urlOf(shown.query) === urlOf(query)) {
    showDetailOf(open);
  } else if (run) {
    closeDetail(true);
    search(query, { history: "none", reveal: false, open });
  }
}

window.addEventListener("popstate", () => {
  if (config.ready) restore();
});

// --- words, a gallery item or a photo → gallery photos and moments, filtered and paged ---------------------------------

function noteQuery(text) {
  el.queryNote.textContent = text;
  el.queryNote.hidden = !text;
}

el.query.addEventListener("input", () => {
  const full = el.query.value.length >= config.maxText;
  noteQuery(full ? `The search box takes up to ${number(config.maxText)} characters.` : "");
});

el.textForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = el.query.value;
  if (!text.trim()) {                       // nothing but spaces: said here, nothing is sent
    noteQuery(`Type a few words describing what to find, for example “${el.query.placeholder}”.`);
    el.query.focus();
    return;
  }
  noteQuery("");
  search({ kind: "text", text, mode: modeOf(el.mode.value), k: k(), offset: 0, options: refinements() });
});

// A photo as the query: the words in the box are not part of it, so they go (and leave the URL with them).
function searchSimilar(file) {
  el.query.value = "";
  noteQuery("");
  search({ kind: "upload", file, k: k(), offset: 0, options: refinements() });
}

function similarForm(query, perPage, offset) {
  const form = new FormData();
  form.append("image", query.file, query.file.name || "photo");
  form.append("k", String(perPage));
  form.append("offset", String(offset));
  for (const [name, value] of Object.entries(query.options)) {
    form.append(name, Array.isArray(value) ? value.join(", ") : String(value));
  }
  return form;
}

// `perPage` results of `query` from `offset` on: the API's answer, {results, strong_match}
async function fetchHits(query, perPage, offset, signal) {
  const page = { k: perPage, offset, ...query.options };
  const body = query.kind === "text" ? { json: { text: query.text, ...(query.mode ? { mode: query.mode } : {}), ...page },
                                         signal }
    : query.kind === "like" ? { json: { image_id: query.id, ...page }, signal }
    : { form: similarForm(query, perPage, offset), signal };
  return requestJSON("v1/search/images", body);
}

// --- the start page: the library's newest photos and a few searches to try ----------------------------------------

const RECENT = 12;                    // photos the start page shows
const EXAMPLES = 4;                   // searches it offers
// searches to offer when the index has no captions to take them from, kept when the gallery has a strong match
const EXAMPLE_QUERIES = ["a dog", "a cat", "a person", "a street at night", "food on a plate", "flowers", "a beach",
                         "a car", "a mountain", "a group of people"];

// The newest photos: every photo in capture-time order (a search whose minimum score lets everything through,
// sorted newest first; index/order.py), photos only.
function recentPhotos(signal) {
  const lowest = SCORE_RANGE[config.similarity]?.[0] ?? -1e9;
  return requestJSON("v1/search/images", { json: { text: "a photo", k: RECENT, sort: "newest", media: "photo",
                                                   min_score: lowest }, signal });
}

// Searches that work here: the nearest caption of a few of the newest photos (an index with a caption corpus),
// else those of EXAMPLE_QUERIES the gallery has a strong match for (all of them when the index cannot tell).
async function exampleQueries(photos, signal) {
  if (config.captions) {
    const found = await Promise.all(photos.slice(0, EXAMPLES).map((photo) => requestJSON("v1/search/captions",
      { json: { image_id: photo.id, k: 1 }, signal }).then(({ results }) => results[0]?.caption, () => null)));
    return [...new Set(found.filter(Boolean))];
  }
  const checked = await Promise.all(EXAMPLE_QUERIES.map((text) => requestJSON("v1/search/images",
    { json: { text, k: 1, media: "photo" }, signal }).then((r) => (r.strong_match !== false ? text : null), () => null)));
  return checked.filter(Boolean).slice(0, EXAMPLES);
}

function recentCard(photo) {
  const img = h("img", { alt: displayName(photo), width: 120, height: 120 });
  const button = h("button", { type: "button", class: "recent", "data-id": String(photo.id), title: displayName(photo),
                               "aria-label": `${displayName(photo)}: find photos like it` }, img);
  button.addEventListener("click", () => {
    search({ kind: "like", id: photo.id, name: displayName(photo), k: k(), offset: 0, options: refinements() });
  });
  return button;
}

// What the page shows under the box before a search: the library's newest photos (each finds more like it) and a
// few example searches (each runs).
async function showStart() {
  if (config.images === 0) return;
  const signal = begin("Loading the newest photos…");
  try {
    const { results } = await recentPhotos(signal);
    if (signal.aborted) return;
    const photos = results.filter((hit) => !isMoment(hit));
    const examples = photos.length ? await exampleQueries(photos, signal) : [];
    if (signal.aborted) return;
    const tries = examples.map((text) => {
      const button = h("button", { type: "button", class: "example", text });
      button.addEventListener("click", () => {
        el.query.value = text;
        search({ kind: "text", text, mode: modeOf(el.mode.value), k: k(), offset: 0, options: refinements() });
      });
      return h("li", {}, button);
    });
    const grid = h("ul", { class: "recent-grid" });
    for (const photo of photos) {
      const button = recentCard(photo);
      grid.append(h("li", {}, button));
      showImage(button.querySelector("img"), photo.id, THUMBNAIL, signal);
    }
    el.results.replaceChildren(...[
      tries.length ? h("div", { class: "examples" }, h("h2", { text: "Try" }), h("ul", {}, ...tries)) : null,
      photos.length ? h("h2", { text: "Newest photos" }) : null, photos.length ? grid : null,
    ].filter(Boolean));
    end(signal);
  } catch (err) {
    if (isAbort(err)) return;
    el.results.setAttribute("aria-busy", "false");
    el.results.replaceChildren();              // the start page is a nicety: a search still works
  }
}

// Whether results follow this page's: one more than the page is asked for (or, at the largest k, the next one).
// strongMatch: whether one of them is a strong match (the one past the page never is unless one shown is: hits
// come best first); null when the index gives no relevance.
async function page(query, signal) {
  const ask = Math.min(query.k + 1, config.maxK);
  const { results, strong_match: strongMatch = null } = await fetchHits(query, ask, query.offset, signal);
  let more = results.length > query.k;
  if (ask === query.k && results.length === query.k) {
    more = (await fetchHits(query, 1, query.offset + query.k, signal)).results.length > 0;
  }
  return { hits: results.slice(0, query.k), more, strongMatch };
}

function searching(query) {
  if (query.kind === "text") return "Searching…";
  return `Finding photos and moments like ${query.kind === "like" ? query.name || "it" : query.file.name || "yours"}…`;
}

// Runs `query` and shows its results. `history`: push (a new entry), replace or none (the URL is already right);
// `reveal`: move the page to the results; `open`: the result to open once shown.
async function search(query, { history = "push", reveal = true, open = null } = {}) {
  setURL(urlOf(query), history);
  const signal = begin(searching(query));
  try {
    const { hits, more, strongMatch } = await page(query, signal);
    if (signal.aborted) return;
    const same = galleryPicture(query, hits);
    if (same) {                                   // the uploaded photo is in the gallery: its URL names it
      query = same;
      setURL(urlOf(query), "replace");
    }
    shown = { query, hits, more, strongMatch };
    renderImages(shown, signal);
    end(signal);
    if (reveal) {
      if (matchMedia("(pointer: coarse)").matches) el.query.blur();      // a phone's keyboard goes away
      revealResults();
    }
    showDetailOf(open);
  } catch (err) {
    if (!isAbort(err)) end(signal, err);
  }
}

// An uploaded photo whose first hit is the same picture is that gallery item: the query "more like" it (which a URL
// can hold, so a reload or a shared link repeats it). null for any other upload.
function galleryPicture(query, hits) {
  const first = hits[0];
  const same = SAME_PICTURE[config.similarity];
  if (query.kind !== "upload" || query.offset || !first || isMoment(first) || same === undefined) return null;
  if (first.score < same) return null;
  const name = query.file.name || displayName(first);          // on screen it keeps the name it was given
  return { kind: "like", id: first.id, name, k: query.k, offset: 0, options: query.options };
}

function nouns(query, hits) {
  const moments = hits.filter(isMoment).length;
  const photosOnly = query.options.media === "photo" || (hits.length ? !moments : config.videos === 0);
  if (photosOnly) return ["photo", "photos"];
  if (query.options.media === "video" || (hits.length && moments === hits.length)) {
    return ["video moment", "video moments"];
  }
  return hits.length ? ["result", "results"] : ["photo or video moment", "photos or video moments"];
}

function displayName(hit) {
  return hit.name || (isMoment(hit) ? `video ${hit.video_id}` : `image ${hit.id}`);
}

function subject(query, hits) {
  if (query.kind === "text") return `for “${query.text}”`;
  if (query.kind === "upload") return `like ${query.file.name || "your photo"}`;
  const itself = hits.find((hit) => hit.id === query.id);
  return `like ${query.name || (itself ? displayName(itself) : `gallery item ${query.id}`)}`;
}

function heading({ query, hits, more }) {
  const [one, many] = nouns(query, hits);
  const what = subject(query, hits);
  const n = hits.length;
  if (!n) {
    if (query.offset) return `No more ${many} ${what}.`;
    const filtered = Object.keys(query.options).some((name) => name !== "subtract");
    if (filtered) return `No ${many} ${what} pass the filters.`;
    return config.images === 0 ? "The gallery is empty." : `Nothing found ${what}.`;
  }
  if (query.offset) return `${capital(many)} ${number(query.offset + 1)}–${number(query.offset + n)} ${what}`;
  if (n === 1) return `1 ${one} ${what}`;
  return `${more ? "Top " : ""}${n} ${many} ${what}`;
}

// The first page of results without a strong match says so: they are only the closest items.
function noStrongMatch({ query, hits, strongMatch }) {
  if (strongMatch !== false || query.offset || !hits.length) return null;
  return h("p", { class: "note no-strong", text: `No strong match ${subject(query, hits)}. These are the closest.` });
}

const isStrong = (hit) => config.strong !== null && typeof hit.relevance === "number" && hit.relevance >= config.strong;

// a page that mixes photos and moments says how many of each
function breakdown(hits) {
  const moments = hits.filter(isMoment).length;
  if (!moments || moments === hits.length) return null;
  return h("p", { class: "breakdown", text: `${count(hits.length - moments, "photo")}, ` +
                                            `${count(moments, "video moment")}` });
}

// seconds → "m:ss" (or "h:mm:ss")
function clock(seconds) {
  const s = Math.floor(seconds);
  const [hh, mm, ss] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60), s % 60];
  const pad = (n) => String(n).padStart(2, "0");
  return hh ? `${hh}:${pad(mm)}:${pad(ss)}` : `${mm}:${pad(ss)}`;
}

function momentText(hit) {
  return `${clock(hit.start)}–${clock(hit.end)}`;
}

// what a result is called: its file name, and a moment's span in its video
function title(hit) {
  return isMoment(hit) ? `${displayName(hit)}, ${momentText(hit)}` : displayName(hit);
}

// The lines a result card shows under its picture, one element each: a new per-result field is one more entry.
function cardFacts(hit) {
  return [
    isMoment(hit) ? h("span", { class: "moment", text: `▶ ${momentText(hit)}` }) : null,
    h("span", { class: "score", text: score(hit.score) }),
    isStrong(hit) ? h("span", { class: "strong", text: "strong match",
                                title: `scores above ${(hit.relevance * 100).toFixed(1)}% of typical photos` })
      : null,
    hit.taken ? h("span", { class: "taken", text: `taken ${hit.taken.slice(0, 10)}` }) : null,
    hit.matched?.length ? h("span", { class: "matched", text: `words: ${hit.matched.join(", ")}`,
                                      title: "found in its file or folder name, the text read in it or its captions" })
      : null,
  ];
}

function card(hit, index) {
  const img = h("img", { alt: title(hit), width: 160, height: 160 });
  const where = hit.folder && hit.folder !== "." ? `${hit.folder}/` : "";
  const strong = isStrong(hit) ? ", strong match" : "";
  const button = h("button", {
    type: "button", class: ["hit", isMoment(hit) ? "video" : null, strong ? "strong" : null].filter(Boolean).join(" "),
    "data-id": String(hit.id), title: where + title(hit),
    "aria-label": `${title(hit)}, score ${score(hit.score)}${strong}: ${isMoment(hit) ? "play it" : "show it larger"}`,
  }, img, h("span", { class: "name", text: displayName(hit) }), h("span", { class: "facts" }, ...cardFacts(hit)));
  button.addEventListener("click", () => openDetail(index));
  return button;
}

function renderImages(results, signal) {
  const { query, hits, more } = results;
  const grid = h("ul", { class: "grid" });
  hits.forEach((hit, index) => {
    const button = card(hit, index);
    grid.append(h("li", {}, button));
    showImage(button.querySelector("img"), hit.id, THUMBNAIL, signal);
  });
  const previous = h("button", { type: "button", id: "previous", text: "Previous", disabled: query.offset === 0 });
  const next = h("button", { type: "button", id: "next", text: "Next", disabled: !more });
  previous.addEventListener("click", () => search({ ...query, offset: Math.max(0, query.offset - query.k) }));
  next.addEventListener("click", () => search({ ...query, offset: query.offset + query.k }));
  const pageNumber = `page ${Math.floor(query.offset / query.k) + 1}`;
  const pager = hits.length || query.offset
    ? h("nav", { class: "pager", "aria-label": "Result pages" }, previous, h("span", { text: pageNumber }), next) : null;
  el.results.replaceChildren(...[h("h2", { text: heading(results) }), breakdown(hits), noStrongMatch(results), grid,
                                 pager].filter(Boolean));
}

// --- a result, larger: nearest captions, open original, more like this, ←/→ --------------------------------------------

function renderCaptionList(list, results) {
  list.replaceChildren(...results.map((hit) => h("li", {}, h("div", { class: "ranked" },
    h("span", { class: "caption", text: hit.caption }), h("span", { class: "score", text: score(hit.score) })))));
  if (!results.length) list.append(h("li", { text: "No captions in the corpus." }));
}

function detailError(err) {
  el.dialogError.textContent = message(err);
  el.dialogError.hidden = false;
}

// a video moment in the detail view: the video, playing from the moment's start
async function showMoment(moment, signal) {
  const player = el.dialogVideo;
  try {
    const { url, revoke } = await videoURL(moment.video_id, moment.start, signal);
    releases.push(revoke);
    player.addEventListener("loadedmetadata", () => { player.currentTime = moment.start; }, { once: true });
    player.src = url;
    player.play().catch(() => {});               // autoplay may be refused: the controls are there
  } catch (err) {
    if (!isAbort(err)) detailError(err);
  }
}

function stopVideo() {
  el.dialogVideo.pause();
  el.dialogVideo.removeAttribute("src");
  el.dialogVideo.load();
}

// the API path of a result's own file: the photo, or a moment's video from its start
function originalPath(hit) {
  return isMoment(hit) ? `v1/videos/${encodeURIComponent(hit.video_id)}` : `v1/images/${encodeURIComponent(hit.id)}`;
}

function facts(hit) {
  const parts = [hit.folder && hit.folder !== "." ? `in ${hit.folder}` : null,
                 hit.taken ? `taken ${hit.taken.slice(0, 10)}` : null,
                 hit.width && hit.height ? `${hit.width} × ${hit.height}` : null,
                 `score ${score(hit.score)}`,
                 typeof hit.relevance === "number" ? `relevance ${score(hit.relevance)}` : null];
  return parts.filter(Boolean).join(" · ");
}

// Opens result `index` of the page in the detail view (or moves the open view to it). `history`: push (Back closes
// it), replace or none.
async function openDetail(index, { history = "push" } = {}) {
  const { query, hits } = shown;
  const hit = hits[index];
  detailAction?.abort();
  detailAction = new AbortController();
  const signal = detailAction.signal;
  const moving = el.dialog.open;
  detailIndex = index;
  stopVideo();
  el.dialogImage.hidden = isMoment(hit);
  el.dialogVideo.hidden = !isMoment(hit);
  el.dialogTitle.textContent = title(hit);
  el.dialogPosition.textContent = `${index + 1} of ${hits.length}`;
  el.dialogFacts.textContent = facts(hit);
  el.dialogOriginal.href = originalPath(hit) + (isMoment(hit) ? `#t=${hit.start}` : "");
  el.dialogLike.hidden = query.kind === "like" && query.id === hit.id;
  el.dialogPrevious.disabled = index === 0;
  el.dialogNext.disabled = index === hits.length - 1;
  el.dialogImage.removeAttribute("src");
  el.dialogImage.alt = title(hit);
  el.dialogError.hidden = true;
  el.dialogCaptions.hidden = el.dialogCaptionsTitle.hidden = !config.captions;
  el.dialogCaptions.replaceChildren(config.captions ? h("li", { class: "loading", text: "Finding captions…" }) : "");
  el.dialogCaptions.setAttribute("aria-busy", String(Boolean(config.captions)));
  if (query.kind !== "upload") {
    const mode = moving && history === "push" ? "replace" : history;      // moving within the view: one entry
    setURL(urlOf(query, hit.id), mode, mode === "push" || window.history.state?.detail ? { detail: true } : null);
  }
  if (!moving) {
    el.dialog.showModal();
    el.dialogClose.focus();
  }
  if (isMoment(hit)) showMoment(hit, signal);
  else showImage(el.dialogImage, hit.id, LARGE, signal);
  if (!config.captions) return;           // no caption corpus: nothing to rank
  try {
    const { results } = await requestJSON("v1/search/captions",
                                          { json: { image_id: hit.id, k: Math.min(DETAIL_CAPTIONS, config.maxK) }, signal });
    renderCaptionList(el.dialogCaptions, results);
  } catch (err) {
    if (isAbort(err)) return;
    el.dialogCaptions.replaceChildren();
    detailError(err);
  } finally {
    if (!signal.aborted) el.dialogCaptions.setAttribute("aria-busy", "false");
  }
}

// the detail view as the URL's `open` says: the result with that id, or closed
function showDetailOf(id) {
  const index = id === null || !shown ? -1 : shown.hits.findIndex((hit) => hit.id === id);
  if (index >= 0) openDetail(index, { history: "none" });
  else closeDetail(true);
}

function closeDetail(quiet) {
  if (!el.dialog.open) return;
  quietClose = quiet;
  el.dialog.close();
}

function step(by) {
  const index = detailIndex + by;
  if (shown && index >= 0 && index < shown.hits.length) openDetail(index, { history: "replace" });
}

el.dialogClose.addEventListener("click", () => el.dialog.close());
el.dialogPrevious.addEventListener("click", () => step(-1));
el.dialogNext.addEventListener("click", () => step(1));
el.dialog.addEventListener("click", (event) => {
  if (event.target === el.dialog) el.dialog.close();          // a click on the backdrop
});
el.dialog.addEventListener("keydown", (event) => {
  if (event.altKey || event.ctrlKey || event.metaKey || event.target === el.dialogVideo) return;   // the player seeks
  if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
    event.preventDefault();
    step(event.key === "ArrowLeft" ? -1 : 1);
  }
});
el.dialog.addEventListener("close", () => {
  detailAction?.abort();
  stopVideo();
  const quiet = quietClose;
  quietClose = false;
  if (quiet || !shown) return;
  // closed by the user: the URL loses `open` (Back, when opening it made the history entry)
  if (window.history.state?.detail) window.history.back();
  else if (shown.query.kind !== "upload") setURL(urlOf(shown.query), "replace");
  el.results.querySelectorAll(".hit")[detailIndex]?.focus();
});

// "Open original": the file in a new tab; with an API key it is fetched here first (a tab cannot send the key)
el.dialogOriginal.addEventListener("click", async (event) => {
  if (!auth.key) return;
  event.preventDefault();
  const hit = shown.hits[detailIndex];
  const tab = window.open("", "_blank");
  try {
    const { url, revoke } = await fileURL(originalPath(hit));
    if (tab) tab.location.href = url + (isMoment(hit) ? `#t=${hit.start}` : "");
    setTimeout(revoke, 60_000);                  // the tab has read it by then
  } catch (err) {
    tab?.close();
    detailError(err);
  }
});

el.dialogLike.addEventListener("click", () => {
  const hit = shown.hits[detailIndex];
  const query = { kind: "like", id: hit.id, name: displayName(hit), k: k(), offset: 0, options: refinements() };
  const opened = window.history.state?.detail;             // this detail view has its own history entry: reuse it
  closeDetail(true);
  el.query.value = "";
  search(query, { history: opened ? "replace" : "push" });
});

// --- image → captions ----------------------------------------------------------------------------------------------

function imageForm(file, withK) {
  const form = new FormData();
  form.append("image", file, file.name || "image");
  if (withK) form.append("k", String(k()));
  return form;
}

async function searchImage(file) {
  setURL(location.pathname, "push");
  const signal = begin(`Finding captions for ${file.name || "the image"}…`);
  const ranked = requestJSON("v1/search/captions", { form: imageForm(file, true), signal });
  const generated = config.decoder ? requestJSON("v1/captions", { form: imageForm(file, false), signal }) : null;
  generated?.catch(() => {});           // handled below, after the ranked captions
  try {
    const { results } = await ranked;
    if (signal.aborted) return;
    const preview = URL.createObjectURL(file);
    releases.push(() => URL.revokeObjectURL(preview));
    const slot = generated ? h("p", { class: "generated loading", text: "Generating a caption…" }) : null;
    const list = h("ol", { class: "captions" });
    renderCaptionList(list, results);
    el.results.replaceChildren(
      h("h2", { text: `Captions for ${file.name || "your image"}` }),
      h("div", { class: "upload" },
        h("img", { src: preview, alt: `Your image ${file.name || ""}`.trim(), class: "preview" }),
        h("div", {}, slot, h("h3", { text: `Nearest ${count(results.length, "caption")} in the corpus` }), list)));
    end(signal);
    revealResults();
    if (generated) await showGenerated(generated, slot, signal);
  } catch (err) {
    if (!isAbort(err)) end(signal, err);
  }
}

async function showGenerated(pending, slot, signal) {
  try {
    const { captions } = await pending;
    slot.classList.remove("loading");
    slot.replaceChildren(h("strong", { text: "Generated: " }), captions.length ? captions[0].text : "(no caption)");
  } catch (err) {
    if (isAbort(err) || signal.aborted) return;
    slot.classList.remove("loading");
    if (err instanceof ApiError && (err.status === 409 || err.status === 501)) {   // 409: no decoder (older versions: 501)
      config.decoder = false;           // this service cannot generate: stop offering it
      slot.classList.add("note");
      slot.textContent = `Caption generation is not available: ${err.detail}`;
    } else {
      slot.classList.add("error");
      slot.textContent = `Caption generation failed. ${message(err)}`;
    }
  }
}

// a file input and its drop zone: a chosen or dropped file goes to `search`; dropping something else says `hint`
function acceptImages(input, zone, search, hint) {
  input.addEventListener("change", () => {
    const [file] = input.files;
    input.value = "";                   // choosing the same file again searches again
    if (file) search(file);
  });
  for (const type of ["dragenter", "dragover"]) {
    zone.addEventListener(type, (event) => {
      event.preventDefault();
      if (!input.disabled) zone.classList.add("over");
    });
  }
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    if (input.disabled) return;
    const [file] = event.dataTransfer.files;
    if (file) search(file);
    else showError(new ApiError(0, hint));
  });
}

acceptImages(el.file, el.drop, searchImage, `Drop an image file (${FORMATS}).`);
acceptImages(el.similarFile, el.similarDrop, searchSimilar, `Drop a photo (${FORMATS}).`);

// --- near-duplicate photos, group by group (GET /v1/duplicates) ---------------------------------------------------

const DUPLICATE_GROUPS = 10;          // groups a page shows
const KINDS = { identical: "Identical files", "re-encode": "Same picture, re-saved or resized",
                near: "Near-duplicates" };

const fileSize = (bytes) => (bytes >= 1e6 ? `${(bytes / 1e6).toFixed(1)} MB` : `${Math.max(1, Math.round(bytes / 1e3))} kB`);

function duplicateCard(image) {
  const img = h("img", { alt: image.name || `image ${image.id}`, width: 160, height: 160 });
  const facts = [image.width && image.height ? `${image.width} × ${image.height}` : null,
                 image.size ? fileSize(image.size) : null, image.taken ? `taken ${image.taken.slice(0, 10)}` : null];
  const where = image.folder && image.folder !== "." ? `${image.folder}/` : "";
  const figure = h("figure", { class: "duplicate", "data-id": String(image.id), title: where + (image.name || "") },
                   img, h("figcaption", {}, h("span", { class: "name", text: image.name || `image ${image.id}` }),
                                       h("span", { class: "facts", text: facts.filter(Boolean).join(" · ") })));
  return figure;
}

async function showDuplicates(threshold, offset) {
  setURL(location.pathname, "push");
  const signal = begin("Comparing the gallery's photos…");
  try {
    const params = new URLSearchParams({ threshold: String(threshold), offset: String(offset),
                                         limit: String(DUPLICATE_GROUPS) });
    const found = await requestJSON(`v1/duplicates?${params}`, { signal });
    if (signal.aborted) return;
    const groups = found.groups.map((group, n) => {
      const row = h("ul", { class: "duplicate-row" });
      for (const image of group.images) {
        const figure = duplicateCard(image);
        row.append(h("li", {}, figure));
        showImage(figure.querySelector("img"), image.id, THUMBNAIL, signal);
      }
      const label = `${KINDS[group.kind] || group.kind}: ${count(group.images.length, "photo")}, similarity ` +
        `${score(group.min_score)} or more`;
      return h("section", { class: "duplicate-group", "data-kind": group.kind, "aria-label": label },
               h("h3", { text: `${number(offset + n + 1)}. ${label}` }), row);
    });
    const heading = found.total
      ? `${count(found.total, "group")} of near-duplicates among ${count(found.photos, "photo")}`
      : `No near-duplicates among ${count(found.photos, "photo")} at similarity ${threshold}.`;
    const previous = h("button", { type: "button", text: "Previous", disabled: offset === 0 });
    const next = h("button", { type: "button", text: "Next", disabled: offset + DUPLICATE_GROUPS >= found.total });
    previous.addEventListener("click", () => showDuplicates(threshold, Math.max(0, offset - DUPLICATE_GROUPS)));
    next.addEventListener("click", () => showDuplicates(threshold, offset + DUPLICATE_GROUPS));
    const pager = found.total > DUPLICATE_GROUPS
      ? h("nav", { class: "pager", "aria-label": "Duplicate pages" }, previous,
          h("span", { text: `page ${Math.floor(offset / DUPLICATE_GROUPS) + 1}` }), next) : null;
    el.results.replaceChildren(...[h("h2", { text: heading }), ...groups, pager].filter(Boolean));
    end(signal);
  } catch (err) {
    if (!isAbort(err)) end(signal, err);
  }
}

el.duplicatesForm.addEventListener("submit", (event) => {
  event.preventDefault();
  showDuplicates(Number(el.duplicatesThreshold.value), 0);
});

// --- sentence → paraphrases (with a decoder) -------------------------------------------------------------------

el.paraphraseForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = el.paraphraseText.value;
  setURL(location.pathname, "push");
  const signal = begin("Paraphrasing…");
  try {
    const { paraphrases } = await requestJSON("v1/paraphrases", { json: { text, n: 5 }, signal });
    if (signal.aborted) return;
    el.results.replaceChildren(h("h2", { text: `Paraphrases of “${text}”` }),
                               h("ol", { class: "captions" }, ...paraphrases.map((p) => h("li", { text: p.text }))));
    end(signal);
  } catch (err) {
    if (isAbort(err)) return;
    if (err instanceof ApiError && (err.status === 409 || err.status === 501)) {   // 409: no decoder (older versions: 501)
      end(signal);
      el.results.replaceChildren();
      for (const control of el.paraphraseForm.elements) control.disabled = true;
      el.paraphraseNote.textContent = `Paraphrasing is not available: ${err.detail}`;
      el.paraphraseNote.hidden = false;
    } else {
      end(signal, err);
    }
  }
});

connect();
