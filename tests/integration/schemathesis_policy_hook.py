"""A schemathesis check (loaded with SCHEMATHESIS_HOOKS): no answer carries a forbidden row."""

from __future__ import annotations

from typing import Any

import schemathesis

from tests.integration.policy_oracle import violations


@schemathesis.check
def policy_holds(ctx: Any, response: Any, case: Any) -> None:
    request = response.request
    found = violations(request.method, request.url, response.status_code, response.content)
    if found:
        raise AssertionError("the policy was broken: " + "; ".join(found))
