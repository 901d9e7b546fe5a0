"""The console's pages: ``GET /console`` (the sign-in form, or the console once signed in),
``POST /console/login``, ``POST /console/logout`` and the static assets under
``/console/static`` (shipped in the package: no CDN, works offline).

Every page carries a Content-Security-Policy that allows only this origin's scripts and
styles, and may not be framed. The console reads its data from the admin API (/admin), which
accepts the console's cookie as well as the bearer token (proxy/api/admin.py).
"""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from talaria.proxy.console.auth import COOKIE, ConsoleAuth, ConsoleLogin
from talaria.proxy.contract.errors import ApiError

STATIC = Path(__file__).parent / "static"
MAX_FORM_BYTES = 4096

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

router = APIRouter(prefix="/console")


def static_files() -> StaticFiles:
    """The assets (scripts, styles, the vendored chart library): public, they hold no data."""
    return StaticFiles(directory=STATIC)


def console_auth(request: Request) -> ConsoleAuth:
    """The app's console auth; 404 when the admin API is off (no admin token)."""
    auth: ConsoleAuth | None = getattr(request.app.state, "console_auth", None)
    if auth is None:
        raise ApiError(404, "The console is off (set TALARIA_ADMIN_TOKEN).", code="not_found")
    return auth


def signed_in(request: Request) -> ConsoleLogin | None:
    """The login the request's console cookie proves; None without one, or with the console
    off."""
    auth: ConsoleAuth | None = getattr(request.app.state, "console_auth", None)
    return auth.check(request.cookies.get(COOKIE)) if auth else None


@cache
def _template(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def _page(name: str, status: int = 200, **values: str) -> HTMLResponse:
    text = _template(name)
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", html.escape(value, quote=True))
    return HTMLResponse(text, status, headers=SECURITY_HEADERS)


@router.get("", include_in_schema=False)
async def console_page(request: Request) -> Response:
    """``GET /console``: the console (its CSRF token embedded) once signed in, else the
    sign-in form."""
    auth = console_auth(request)
    login = signed_in(request)
    if login is None:
        return _page("login.html", error="")
    return _page("console.html", csrf=auth.csrf_token(login))


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form of at most ``MAX_FORM_BYTES``; the last value of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ApiError(413, "The form is too large.", code="request_too_large")
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in fields.items()}


def client_address(request: Request) -> str:
    """The peer address that failed sign-ins are counted against."""
    return request.client.host if request.client else "unknown"


@router.post("/login", include_in_schema=False)
async def login(request: Request) -> Response:
    """``POST /console/login``: check the form's admin token (throttled per address) and set
    the console cookie, then redirect to the console (303); 401 or 429 with the form again."""
    auth = console_auth(request)
    form = await _form(request)
    address = client_address(request)
    verdict = auth.sign_in(address, form.get("token", ""))
    if verdict.retry_after_s is not None:
        wait_s = verdict.retry_after_s
        page = _page("login.html", 429, error=f"Too many failed sign-ins; retry in {wait_s} s.")
        page.headers["retry-after"] = str(wait_s)
        return page
    if not verdict.ok:
        return _page("login.html", 401, error="That is not the admin token.")
    cookie, _ = auth.issue()
    response = RedirectResponse("/console", status_code=303, headers=SECURITY_HEADERS)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=auth.login_s,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout", include_in_schema=False)
async def logout(request: Request) -> Response:
    """``POST /console/logout``: revoke the login (its CSRF token required, else 403), clear
    the cookie and redirect to the sign-in form (303)."""
    auth = console_auth(request)
    form = await _form(request)
    login = signed_in(request)
    if login is not None:
        if not auth.csrf_ok(login, form.get("csrf")):
            raise ApiError(403, "Missing or wrong CSRF token.", code="csrf_failed")
        auth.revoke(login)
    response = RedirectResponse("/console", status_code=303, headers=SECURITY_HEADERS)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
