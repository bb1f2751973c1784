"""The search page's order control and its near-duplicates view, in headless Chromium (the browser, the live app
and the photo gallery with EXIF capture dates are tests/test_web.py's): "Newest first" shows the API's
``sort: newest`` results above the minimum score, and keeps the order in the URL; "Find duplicates" shows the
groups of ``GET /v1/duplicates`` side by side, page by page."""
import httpx

from test_web import _hits, _open_panel, _search, _wait_heading, _wait_ready, photo_server, browser, tab  # noqa: F401

QUERY = "a red circle above a blue square"


def _ids(results):
    return [x["id"] for x in results]


def test_newest_first_orders_the_results_above_the_minimum_by_capture_date(photo_server, tab):  # noqa: F811
    server = photo_server
    every = httpx.post(server.url + "/v1/search/images", json={"text": QUERY, "k": 50}, timeout=30).json()["results"]
    cut = round(every[9]["score"], 3)
    want = httpx.post(server.url + "/v1/search/images", timeout=30,
                      json={"text": QUERY, "k": 50, "min_score": cut, "sort": "newest"}).json()["results"]
    assert [x["taken"] for x in want] == sorted((x["taken"] for x in want), reverse=True)
    page = tab.open(server.url)
    _wait_ready(page)
    _open_panel(page, "filters")
    page.fill("#min-score", str(cut))
    page.select_option("#sort", "newest")
    _search(page, QUERY, k=50)
    page.wait_for_function("n => document.querySelectorAll('#results[aria-busy=false] .hit').length === n",
                           arg=len(want))
    assert [i for i, _ in _hits(page)] == _ids(want)
    dates = page.eval_on_selector_all(".hit .taken", "els => els.map(e => e.textContent)")
    assert dates == [f"taken {x['taken'][:10]}" for x in want]
    assert "sort=newest" in page.url
    page.reload()                                        # the URL holds the order
    _wait_ready(page)
    page.wait_for_function("n => document.querySelectorAll('#results[aria-busy=false] .hit').length === n",
                           arg=len(want))
    assert [i for i, _ in _hits(page)] == _ids(want) and page.input_value("#sort") == "newest"


def _groups(page):
    return page.eval_on_selector_all(".duplicate-group", "els => els.map(g => [g.dataset.kind, "
                                                         "[...g.querySelectorAll('.duplicate')].map(f => "
                                                         "Number(f.dataset.id))])")


def test_the_duplicates_view_shows_the_api_s_groups_side_by_side(photo_server, tab):  # noqa: F811
    server = photo_server
    threshold = 0.95
    api = httpx.get(server.url + "/v1/duplicates", params={"threshold": threshold, "limit": 10}, timeout=60).json()
    assert api["total"] > 0, "the tiny model's gallery should have groups at this threshold"
    page = tab.open(server.url)
    _wait_ready(page)
    page.click("#duplicates-toggle")                    # in the header: the search's tab order is the same
    page.wait_for_selector("#duplicates", state="visible")
    page.fill("#duplicates-threshold", str(threshold))
    page.click("#duplicates button[type=submit]")
    _wait_heading(page, f"{api['total']} group")
    assert _groups(page) == [[g["kind"], _ids(g["images"])] for g in api["groups"]]
    # each group's photos sit in one row, side by side
    tops = page.eval_on_selector_all(".duplicate-group:first-of-type .duplicate",
                                     "els => els.map(e => Math.round(e.getBoundingClientRect().top))")
    assert len(set(tops)) == 1 and len(tops) == len(api["groups"][0]["images"])
    page.wait_for_function("""() => [...document.querySelectorAll('.duplicate img')]
        .every((img) => img.complete && img.naturalWidth > 0)""")
    if api["total"] > 10:
        page.click("nav[aria-label='Duplicate pages'] button:last-child")
        second = httpx.get(server.url + "/v1/duplicates", params={"threshold": threshold, "limit": 10, "offset": 10},
                           timeout=60).json()
        page.wait_for_function("first => document.querySelector('.duplicate-group h3')?.textContent"
                               ".startsWith('11.')")
        assert _groups(page) == [[g["kind"], _ids(g["images"])] for g in second["groups"]]
