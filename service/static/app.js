// The search page: sentence → gallery images, a photo → similar gallery images (both with words to leave out, a
// score threshold, folder and date filters, and pages), image → ranked (and, with a decoder, generated) captions,
// sentence → paraphrases. Everything it shows comes from the /v1 API through api.js.
import { ApiError, auth, imageURL, readiness, request, requestJSON, videoURL } from "./api.js";

const $ = (id) => document.getElementById(id);
const el = {
  status: $("status"), error: $("error"), results: $("results"),
  keyForm: $("key-form"), keyInput: $("api-key"), keyHint: $("key-hint"),
  textForm: $("text-form"), query: $("query"), k: $("k"), searchButton: $("search-button"),
  drop: $("drop"), file: $("image-file"),
  similarDrop: $("similar-drop"), similarFile: $("similar-file"),
  subtract: $("subtract"), minScore: $("min-score"), folder: $("folder"), takenAfter: $("taken-after"),
  takenBefore: $("taken-before"), media: $("media"),
  paraphraseForm: $("paraphrase-form"), paraphraseText: $("paraphrase-text"), paraphraseNote: $("paraphrase-note"),
  dialog: $("detail"), dialogTitle: $("detail-title"), dialogImage: $("detail-image"), dialogVideo: $("detail-video"),
  dialogCaptions: $("detail-captions"), dialogError: $("detail-error"), dialogClose: $("detail-close"),
};

const K_CHOICES = [5, 10, 20, 50, 100];
const THUMBNAIL = 256;
const LARGE = 640;
const DETAIL_CAPTIONS = 5;

const FORMATS = "JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC or AVIF";
const SCORE_RANGE = { cosine: [-1, 1], order: [null, 0] };

const config = { ready: false, decoder: false, keyRequired: false, maxK: 100 };
let action = null;            // AbortController of the search whose results the page is waiting for
let releases = [];            // revoke() of every blob: URL the results show
let detailAction = null;
let detailOpener = null;

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
const k = () => Number(el.k.value) || 10;
const isAbort = (err) => err && err.name === "AbortError";

function message(err) {
  return err instanceof ApiError ? err.summary : `Unexpected error: ${err.message || err}`;
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

async function loadFolders() {
  try {
    const { folders } = await requestJSON("v1/folders");
    const chosen = el.folder.value;
    el.folder.replaceChildren(h("option", { value: "", text: "All folders" }),
      ...folders.map((f) => h("option", {
        value: f.folder, text: `${f.folder === "." ? "(top folder)" : f.folder} (${f.images})` })));
    el.folder.value = chosen;
  } catch (err) {
    // the folder filter stays at "All folders"; a missing key is asked for by api.js
  }
}

function fillK(maxK) {
  const choices = K_CHOICES.filter((v) => v <= maxK);
  if (!choices.includes(maxK) && maxK < K_CHOICES.at(-1)) choices.push(maxK);
  const selected = choices.includes(10) ? 10 : choices.at(-1);
  el.k.replaceChildren(...choices.map((v) => h("option", { value: String(v), text: String(v), selected: v === selected })));
}

function configure(ready) {
  config.ready = true;
  config.decoder = Boolean(ready.decoder);
  config.keyRequired = Boolean(ready.api_key_required);
  config.maxK = ready.max_k || 100;
  fillK(config.maxK);
  const hub = ready.hubness_correction || {};
  el.status.textContent = `Ready: ${ready.images} images, ${ready.captions} captions` +
    (hub.text_to_image || hub.image_to_text ? ", hubness-corrected ranking" : ", ranking without hubness correction") +
    (config.decoder ? ", caption generator on" : "");
  el.paraphraseForm.hidden = !config.decoder;
  setScoreRange(ready.similarity);
  setControls(true);
  if (config.keyRequired && !auth.key) askForKey("This service needs an API key for searches.");
  else loadFolders();
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
});

// --- sentence or photo → images, refined and paged -----------------------------------------------------------------

// The refinements as the API takes them; sent as typed (the API says what is wrong with a value).
function refinements() {
  const options = {};
  const subtract = el.subtract.value.split(",").map((w) => w.trim()).filter(Boolean);
  if (subtract.length) options.subtract = subtract;
  if (el.minScore.value.trim() !== "") options.min_score = Number(el.minScore.value);
  if (el.folder.value) options.folder = el.folder.value;
  if (el.takenAfter.value) options.taken_after = el.takenAfter.value;
  if (el.takenBefore.value) options.taken_before = el.takenBefore.value;
  if (el.media.value) options.media = el.media.value;
  return options;
}

function similarForm(query) {
  const form = new FormData();
  form.append("image", query.file, query.file.name || "photo");
  form.append("k", String(query.k));
  form.append("offset", String(query.offset));
  for (const [name, value] of Object.entries(query.options)) {
    form.append(name, Array.isArray(value) ? value.join(", ") : String(value));
  }
  return form;
}

async function searchImages(query) {
  const label = query.kind === "text" ? "Searching…" : `Finding photos like ${query.file.name || "yours"}…`;
  const signal = begin(label);
  const request = query.kind === "text"
    ? { json: { text: query.text, k: query.k, offset: query.offset, ...query.options }, signal }
    : { form: similarForm(query), signal };
  try {
    const { results } = await requestJSON("v1/search/images", request);
    if (signal.aborted) return;
    renderImages(query, results, signal);
    end(signal);
  } catch (err) {
    if (!isAbort(err)) end(signal, err);
  }
}

function heading(query, count) {
  const what = query.kind === "text" ? `for “${query.text}”` : `like ${query.file.name || "your photo"}`;
  if (!count) {
    if (query.offset) return `No more images ${what}.`;
    const refined = Object.keys(query.options).some((name) => name !== "subtract");
    return refined ? `No images ${what} pass the filters.` : "The gallery is empty.";
  }
  return query.offset ? `Images ${query.offset + 1}–${query.offset + count} ${what}` : `Top ${count} images ${what}`;
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

function renderImages(query, results, signal) {
  const grid = h("ul", { class: "grid" });
  for (const hit of results) {
    const video = hit.media === "video";
    const what = video ? `Moment ${momentText(hit)} of video ${hit.video_id}` : `Gallery image ${hit.id}`;
    const img = h("img", { alt: what, width: 160, height: 160 });
    const taken = hit.taken ? h("span", { class: "taken", text: `taken ${hit.taken.slice(0, 10)}` }) : null;
    const moment = video ? h("span", { class: "moment", text: `▶ ${momentText(hit)}` }) : null;
    const button = h("button", { type: "button", class: video ? "hit video" : "hit", "data-id": String(hit.id),
                                 "aria-label": `${what}, score ${score(hit.score)}: ${video ? "play it" : "show it larger"}` },
                     img, moment, h("span", { class: "score", text: score(hit.score) }), taken);
    button.addEventListener("click", () => openDetail(hit.id, button, video ? hit : null));
    grid.append(h("li", {}, button));
    showImage(img, hit.id, THUMBNAIL, signal);
  }
  const previous = h("button", { type: "button", id: "previous", text: "Previous", disabled: query.offset === 0 });
  const next = h("button", { type: "button", id: "next", text: "Next", disabled: results.length < query.k });
  previous.addEventListener("click", () => searchImages({ ...query, offset: Math.max(0, query.offset - query.k) }));
  next.addEventListener("click", () => searchImages({ ...query, offset: query.offset + query.k }));
  const page = `page ${Math.floor(query.offset / query.k) + 1}`;
  const pager = results.length || query.offset
    ? h("nav", { class: "pager", "aria-label": "Result pages" }, previous, h("span", { text: page }), next) : null;
  el.results.replaceChildren(...[h("h2", { text: heading(query, results.length) }), grid, pager].filter(Boolean));
}

el.textForm.addEventListener("submit", (event) => {
  event.preventDefault();
  // sent as typed: the API says what is wrong with it
  searchImages({ kind: "text", text: el.query.value, k: k(), offset: 0, options: refinements() });
});

function searchSimilar(file) {
  searchImages({ kind: "similar", file, k: k(), offset: 0, options: refinements() });
}

// --- a gallery image, larger, with its nearest captions -----------------------------------------------------------

function renderCaptionList(list, results) {
  list.replaceChildren(...results.map((hit) => h("li", {}, h("div", { class: "ranked" },
    h("span", { class: "caption", text: hit.caption }), h("span", { class: "score", text: score(hit.score) })))));
  if (!results.length) list.append(h("li", { text: "No captions in the corpus." }));
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
    if (!isAbort(err)) {
      el.dialogError.textContent = message(err);
      el.dialogError.hidden = false;
    }
  }
}

function stopVideo() {
  el.dialogVideo.pause();
  el.dialogVideo.removeAttribute("src");
  el.dialogVideo.load();
}

async function openDetail(id, opener, moment = null) {
  detailAction?.abort();
  detailAction = new AbortController();
  const signal = detailAction.signal;
  detailOpener = opener;
  stopVideo();
  el.dialogImage.hidden = Boolean(moment);
  el.dialogVideo.hidden = !moment;
  el.dialogTitle.textContent = moment ? `Video ${moment.video_id}, ${momentText(moment)}` : `Gallery image ${id}`;
  el.dialogImage.removeAttribute("src");
  el.dialogImage.alt = `Gallery image ${id}`;
  el.dialogError.hidden = true;
  el.dialogCaptions.replaceChildren(h("li", { class: "loading", text: "Finding captions…" }));
  el.dialogCaptions.setAttribute("aria-busy", "true");
  if (!el.dialog.open) el.dialog.showModal();
  el.dialogClose.focus();
  if (moment) showMoment(moment, signal);
  else showImage(el.dialogImage, id, LARGE, signal);
  try {
    const { results } = await requestJSON("v1/search/captions",
                                          { json: { image_id: id, k: Math.min(DETAIL_CAPTIONS, config.maxK) }, signal });
    renderCaptionList(el.dialogCaptions, results);
  } catch (err) {
    if (isAbort(err)) return;
    el.dialogCaptions.replaceChildren();
    el.dialogError.textContent = message(err);
    el.dialogError.hidden = false;
  } finally {
    if (!signal.aborted) el.dialogCaptions.setAttribute("aria-busy", "false");
  }
}

el.dialogClose.addEventListener("click", () => el.dialog.close());
el.dialog.addEventListener("click", (event) => {
  if (event.target === el.dialog) el.dialog.close();          // a click on the backdrop
});
el.dialog.addEventListener("close", () => {
  detailAction?.abort();
  stopVideo();
  detailOpener?.focus();
});

// --- image → captions ----------------------------------------------------------------------------------------------

function imageForm(file, withK) {
  const form = new FormData();
  form.append("image", file, file.name || "image");
  if (withK) form.append("k", String(k()));
  return form;
}

async function searchImage(file) {
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
        h("div", {}, slot, h("h3", { text: `Nearest ${results.length} captions in the corpus` }), list)));
    end(signal);
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

// --- sentence → paraphrases (with a decoder) -------------------------------------------------------------------

el.paraphraseForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = el.paraphraseText.value;
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
