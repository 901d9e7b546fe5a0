"""The operator console in a real browser against a real ``talaria serve``: sign-in, live
sessions, a session's timeline, ending a session, the node view, replay results, what an
unauthenticated caller gets, and accessibility basics. Every wait is Playwright's own
(it polls the page until the condition holds or its timeout fails the test)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from bench.harness.processes import talaria_command
from tests.browser.conftest import ADMIN_TOKEN, ARTIFACTS, Console, screenshot, sign_in
from tests.support import admin_get

MODEL_A = "glm-4.5-fp8"
MODEL_B = "qwen3-235b-a22b-bf16"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files of a directory",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


class AgentSession:
    """One agent session (its id in the session header) whose every call continues the
    conversation with the reply and a tool result. The calls are plain JSON over httpx: the
    ``openai`` client's request transform walks every message of every call, which made a
    500-call session's client 90% of its two minutes (the real clients are tested elsewhere)."""

    def __init__(self, console: Console, session: str, model: str = MODEL_A) -> None:
        self.http = httpx.Client(base_url=console.serve.v1, timeout=60)
        self.session, self.model = session, model
        self.messages: list[dict[str, Any]] = [
            {"role": "user", "content": "What is in this repository?"}
        ]

    def calls(self, n: int, max_tokens: int = 64) -> AgentSession:
        for _ in range(n):
            body = {
                "model": self.model,
                "messages": self.messages,
                "tools": TOOLS,
                "max_tokens": max_tokens,
            }
            reply = self.http.post(
                "/chat/completions", json=body, headers={"x-talaria-session-id": self.session}
            )
            reply.raise_for_status()
            message = reply.json()["choices"][0]["message"]
            self.messages.append({k: v for k, v in message.items() if v is not None})
            tool_calls = message.get("tool_calls")
            call_id = tool_calls[0]["id"] if tool_calls else "none"
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": "src/"})
            self.messages.append({"role": "user", "content": "Go on."})
        return self


def run_session(
    console: Console, session: str, calls: int, model: str = MODEL_A, max_tokens: int = 64
) -> None:
    AgentSession(console, session, model).calls(calls, max_tokens)


def admin(console: Console, path: str) -> Any:
    return admin_get(console.serve.base_url, ADMIN_TOKEN, path)


def session_key(console: Console, session_id: str) -> str:
    page = admin(console, "/admin/sessions?limit=1000")
    keys = [s["session_key"] for s in page["data"] if s["session_id"] == session_id]
    assert len(keys) == 1, keys
    return str(keys[0])


def test_unauthenticated_requests_get_nothing(console: Console, page: Page) -> None:
    base = console.serve.base_url
    with httpx.Client(base_url=base) as http:
        login = http.get("/console")
        assert login.status_code == 200
        assert 'name="csrf-token"' not in login.text and "Sign in" in login.text
        assert "frame-ancestors 'none'" in login.headers["content-security-policy"]
        for method, path in [
            ("GET", "/admin/sessions"),
            ("GET", "/admin/instances"),
            ("GET", "/admin/sessions/anything"),
            ("POST", "/admin/sessions/anything/end"),
        ]:
            assert http.request(method, path).status_code == 401, path
        http.cookies.set("talaria_console", "9999999999.nonce.0000")
        assert http.get("/admin/sessions").status_code == 401  # a forged cookie
        http.cookies.clear()
        wrong = http.post("/console/login", data={"token": "not-the-token"})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    page.goto(console.url)
    expect(page.get_by_label("Admin token")).to_be_visible()
    expect(page.locator("#main table")).to_have_count(0)
    screenshot(page, "sign-in")


def test_sign_in_sets_a_strict_http_only_cookie_and_sign_out_ends_it(
    console: Console, page: Page
) -> None:
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    sign_in(page, console)
    assert all(ADMIN_TOKEN not in url for url in urls), "the token went into a URL"
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "talaria_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ADMIN_TOKEN not in cookie["value"]
    # the cookie alone cannot change anything: a mutation needs the page's CSRF token
    jar = {"talaria_console": cookie["value"]}
    with httpx.Client(base_url=console.serve.base_url, cookies=jar) as http:
        assert http.get("/admin/sessions").status_code == 200
        refused = http.post("/admin/sessions/x/end")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "csrf_failed"
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_label("Admin token")).to_be_visible()
        assert http.get("/admin/sessions").status_code == 401


def test_a_session_made_by_api_calls_appears_live(console: Console, page: Page) -> None:
    sign_in(page, console)
    session = f"live-{uuid.uuid4().hex[:8]}"
    expect(page.locator("#sessions")).not_to_contain_text(session)
    run_session(console, session, calls=3)
    row = page.locator("tr[data-session]", has_text=session)
    expect(row).to_have_count(1)  # polled by the page, no reload
    expect(row.locator("td").nth(5)).to_have_text("3")
    expect(row).to_contain_text(MODEL_A)
    expect(row).to_contain_text("node0")
    screenshot(page, "sessions")


def test_timeline_draws_one_bar_per_call_and_explains_a_call(console: Console, page: Page) -> None:
    session = f"timeline-{uuid.uuid4().hex[:8]}"
    agent = AgentSession(console, session).calls(3)
    # another model takes the node meanwhile: the session's next call waits for its slot
    run_session(console, f"other-{uuid.uuid4().hex[:8]}", calls=1, model=MODEL_B)
    agent.calls(2)
    key = session_key(console, session)
    calls = admin(console, f"/admin/sessions/{key}")["calls"]
    assert len(calls) == 5
    sign_in(page, console)
    page.get_by_role("link", name=session).click()
    box = page.locator("#timeline-box")
    expect(box).to_have_attribute("data-main-calls", str(len(calls)))
    expect(page.locator("#calls-table tbody tr")).to_have_count(len(calls))
    waited = calls[3]
    assert waited["slot_wait_s"] > 0
    note = page.locator("#notes li", has_text="Call 3 waited")
    # the note's threshold is a tenth of the session's time up to its last call (at most 1 s):
    # it does not grow while the page opens late, as it did when CI was slow (the 0.3 s wait
    # went unnoted when the page opened 12 s after the calls)
    expect(note).to_contain_text(f"for {MODEL_A}'s next slot on node0.")
    # click the decode bar of the last call on the canvas
    point = page.evaluate(
        """() => {
          const chart = Chart.getChart(document.getElementById('timeline'));
          const i = chart.data.datasets.findIndex((d) => d.label === 'decode');
          const meta = chart.getDatasetMeta(i);
          const bar = meta.data[meta.data.length - 1];
          const rect = chart.canvas.getBoundingClientRect();
          return { x: rect.left + (bar.base + bar.x) / 2, y: rect.top + bar.y };
        }"""
    )
    page.mouse.click(point["x"], point["y"])
    detail = page.locator("#call-detail")
    expect(detail).to_contain_text(f"Call {calls[-1]['call_index']}")
    expect(detail).to_contain_text(calls[-1]["request_id"])
    expect(detail).to_contain_text("Routing scores")
    screenshot(page, "session-timeline")


def test_a_session_with_two_conversations_draws_a_lane_per_thread(
    console: Console, page: Page
) -> None:
    """Two conversations under one id are one session (one row in the list) and two lanes of
    its timeline."""
    session = f"threads-{uuid.uuid4().hex[:8]}"
    AgentSession(console, session).calls(2)
    side = AgentSession(console, session)
    side.messages = [{"role": "user", "content": "Write a title for this task."}]
    side.calls(1)
    rows = [s for s in admin(console, "/admin/sessions?limit=1000")["data"]]
    assert [r["session_id"] for r in rows].count(session) == 1
    sign_in(page, console)
    page.get_by_role("link", name=session).click()
    expect(page.locator("#timeline-box")).to_have_attribute("data-main-calls", "3")
    lanes = page.evaluate("() => Chart.getChart(document.getElementById('timeline')).data.labels")
    assert lanes == [f"session {session} · thread 0", f"session {session} · thread 1"]


def test_ending_a_session_from_the_page(console: Console, page: Page) -> None:
    session = f"end-{uuid.uuid4().hex[:8]}"
    run_session(console, session, calls=2)
    key = session_key(console, session)
    sign_in(page, console)
    page.goto(f"{console.url}#/session/{key}")
    page.get_by_role("button", name="End session").click()
    expect(page.locator("#session-state")).to_have_text("ended")
    stored = admin(console, f"/admin/sessions/{key}")["session"]
    assert stored["state"] == "ended" and stored["end_reason"] == "admin"


def test_node_view_follows_a_model_switch(console: Console, page: Page) -> None:
    run_session(console, f"warm-{uuid.uuid4().hex[:8]}", calls=1, model=MODEL_A)
    sign_in(page, console)
    page.get_by_role("link", name="Nodes").click()
    card = page.locator("section.card[data-instance='node0']")
    expect(card).to_have_attribute("data-active-model", MODEL_A)
    slots_before = int(card.get_attribute("data-slots") or 0)
    run_session(console, f"switch-{uuid.uuid4().hex[:8]}", calls=1, model=MODEL_B)
    expect(card).to_have_attribute("data-active-model", MODEL_B)
    page.wait_for_function(
        "n => Number(document.querySelector(\"section.card[data-instance='node0']\")"
        ".dataset.slots) > n",
        arg=slots_before,
    )
    expect(card.locator(f"tr[data-model='{MODEL_B}']")).to_contain_text("active")
    tenants = page.locator("#tenants tbody tr[data-tenant]")  # the open proxy's one tenant
    expect(tenants).to_have_count(1)
    expect(tenants.first).to_contain_text("100%")
    screenshot(page, "nodes")


def test_replay_results_open_in_the_console(console: Console, page: Page, tmp_path: Path) -> None:
    document = tmp_path / "replay.json"
    subprocess.run(
        [
            *talaria_command(),
            "replay",
            "--preset",
            "paper",
            "--sessions",
            "8",
            "--policies",
            "round,talaria",
            "--no-progress",
            "--json",
            str(document),
        ],
        check=True,
        capture_output=True,
    )
    doc = json.loads(document.read_text())
    references = [r for r in ("oracle", "dedicated") if r in doc]
    sign_in(page, console)
    page.get_by_role("link", name="Replay results").click()
    page.get_by_label("Results document (JSON)").set_input_files(str(document))
    expect(page.locator("#replay-table tbody tr")).to_have_count(
        len(doc["policies"]) + len(references)
    )
    curves = page.locator("#cdf").locator("xpath=..")
    expect(curves).to_have_attribute("data-curves", str(len(doc["policies"]) + len(references)))
    timelines = [p for p, s in doc["policies"].items() if s.get("timeline")]
    expect(page.locator("#timelines canvas")).to_have_count(len(timelines))
    screenshot(page, "replay")
    page.get_by_label("Results document (JSON)").set_input_files(
        files=[{"name": "bad.json", "mimeType": "application/json", "buffer": b'{"x": 1}'}]
    )
    expect(page.locator("#replay-error")).to_contain_text("not a talaria replay document")


MARKUP = "<img src=x onerror=document.title='pwned'><b>bold</b>"
"""Markup a replay document's strings may hold: it must show as text (the console builds the
replay view's DOM from its parts, never from markup)."""


def test_a_replay_document_holding_markup_shows_it_as_text(console: Console, page: Page) -> None:
    timeline = [{"node": MARKUP, "model": MARKUP, "start_s": 0.0, "switch_s": 1.0, "end_s": 4.0}]
    policy = {
        "p50_sct_s": 1.0,
        "p95_sct_s": 2.0,
        "mean_sct_s": 1.5,
        "switches": MARKUP,
        "sct_s": {"s0": 1.0, "s1": 2.0},
        "timeline": timeline,
    }
    doc = {
        "policies": {MARKUP: policy},
        "preset": MARKUP,
        "seed": MARKUP,
        "sessions": MARKUP,
        "calls": MARKUP,
    }
    sign_in(page, console)
    page.get_by_role("link", name="Replay results").click()
    page.get_by_label("Results document (JSON)").set_input_files(
        files=[
            {
                "name": f"{MARKUP}.json",
                "mimeType": "application/json",
                "buffer": json.dumps(doc).encode(),
            }
        ]
    )
    replay = page.locator("#replay")
    expect(replay.locator("#replay-table tbody tr")).to_have_count(1)
    assert replay.locator("img, b").count() == 0  # no element came from the document
    cells = replay.locator("#replay-table tbody td")
    expect(cells.nth(0)).to_have_text(MARKUP)
    expect(cells.nth(4)).to_have_text(MARKUP)
    expect(replay.locator("h2").first).to_have_text(f"{MARKUP}.json")
    expect(replay.locator("p").first).to_contain_text(f"preset {MARKUP}, seed {MARKUP}")
    expect(replay.locator("p").first).to_contain_text(f"{MARKUP} sessions, {MARKUP} calls")
    expect(replay.locator("#timelines h2")).to_have_text(
        f"{MARKUP}: 1 model slots, 1.00 s switching"
    )
    expect(replay.locator("#timelines .legend span").first).to_have_text(MARKUP)
    assert page.title() != "pwned"


def test_a_500_call_session_is_drawn_whole(console: Console, page: Page) -> None:
    session = f"long-{uuid.uuid4().hex[:8]}"
    run_session(console, session, calls=500, max_tokens=8)
    key = session_key(console, session)
    sign_in(page, console)
    page.goto(f"{console.url}#/session/{key}")
    box = page.locator("#timeline-box")
    expect(box).to_have_attribute("data-main-calls", "500", timeout=30_000)
    render_ms = page.evaluate(
        """() => {
          const chart = Chart.getChart(document.getElementById('timeline'));
          const t0 = performance.now();
          for (let i = 0; i < 10; i++) chart.update('none');
          return (performance.now() - t0) / 10;
        }"""
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "long-session.json").write_text(json.dumps({"calls": 500, "redraw_ms": render_ms}))
    page.get_by_role("button", name="Zoom in").click()
    expect(page.locator("#calls-table tbody tr")).to_have_count(500)


def test_keyboard_labels_and_contrast(console: Console, page: Page) -> None:
    session = f"a11y-{uuid.uuid4().hex[:8]}"
    run_session(console, session, calls=1)
    sign_in(page, console)
    expect(page.locator("tr[data-session]", has_text=session)).to_have_count(1)
    unlabeled = page.evaluate(
        """() => [...document.querySelectorAll('input:not([type=hidden]), select')]
              .filter((e) => !e.hidden && !(e.labels && e.labels.length))
              .filter((e) => !e.getAttribute('aria-label'))
              .map((e) => e.outerHTML)"""
    )
    assert unlabeled == []
    # keyboard only: tab from the page's start to the session's link, open it with Enter
    page.locator("body").focus()
    link = page.get_by_role("link", name=session)
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.textContent.trim()") == session:
            break
    else:
        pytest.fail("the session link is not reachable with Tab")
    expect(link).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name=f"Session {session}")).to_be_visible()
    worst = page.evaluate(
        """() => {
          const rgb = (c) => c.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number);
          const lum = ([r, g, b]) => {
            const f = (v) => {
              v /= 255;
              return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
            };
            return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
          };
          const background = (e) => {
            for (; e; e = e.parentElement) {
              const c = getComputedStyle(e).backgroundColor;
              if (!c.startsWith('rgba(0, 0, 0, 0)') && c !== 'transparent') return c;
            }
            return 'rgb(255, 255, 255)';
          };
          let worst = 21;
          const texts = 'h1, h2, th, td, dt, dd, a, button, label, p';
          for (const e of document.querySelectorAll(texts)) {
            if (!e.textContent.trim() || e.offsetParent === null) continue;
            const a = lum(rgb(getComputedStyle(e).color)), b = lum(rgb(background(e)));
            worst = Math.min(worst, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05));
          }
          return worst;
        }"""
    )
    assert worst >= 4.5, f"a text's contrast is {worst:.2f}:1 (WCAG AA wants 4.5:1)"
