"""The output limit against the model's context window (proxy/callpath/stages.py ``fit_window``):
a client's own limit is kept or refused, the server's default is fitted."""

from __future__ import annotations

import pytest

from talaria.core.calls import Call
from talaria.proxy.callpath.stages import fit_window
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.identity import Identity


def _prepared(own: int | None, default: int = 4096) -> PreparedCall:
    return PreparedCall(
        request_id="r",
        tenant_id="t",
        identity=Identity(None, "implicit", None, None, False),
        api="chat",
        content=Call(
            model="m", messages=({"role": "user", "content": "hi"},), max_output_tokens=own
        ),
        max_tokens=own or default,
    )


@pytest.mark.parametrize(
    ("own", "prompt", "window", "limit"),
    [
        (None, 100, None, 4096),  # no window known: unchanged
        (None, 100, 8192, 4096),  # fits
        (None, 100, 2048, 1948),  # the default is fitted (issue 26, defect 2)
        (None, 2047, 2048, 1),
        (1000, 1048, 2048, 1000),  # the client's own, fitting exactly
        (8, 4000, 8192, 8),
    ],
)
def test_a_limit_that_fits_or_can_be_fitted(
    own: int | None, prompt: int, window: int | None, limit: int
) -> None:
    assert fit_window(_prepared(own), prompt, window).max_tokens == limit


@pytest.mark.parametrize(
    ("own", "prompt", "window", "says"),
    [
        (1001, 1048, 2048, "asks for up to 1001 more"),  # the client's own does not fit
        (None, 2048, 2048, "leaves no room for output"),  # the prompt fills the window
        (None, 9000, 8192, "leaves no room for output"),
    ],
)
def test_a_limit_that_cannot_fit_is_a_400(
    own: int | None, prompt: int, window: int, says: str
) -> None:
    with pytest.raises(ApiError) as refused:
        fit_window(_prepared(own), prompt, window)
    assert refused.value.status == 400 and refused.value.code == "context_length_exceeded"
    assert says in str(refused.value)
