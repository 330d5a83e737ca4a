"""The five-line terminal summary of a report (what `headcount demo` / `make demo` print).

    summary_lines(report) -> [5 strings]
      1. heads per role
      2. the top heads (the highest-scoring labelled head of each role)
      3. the chapter's fifteen claims: how many held out of 15, then each one's status
      4. the model's three accounts (KV cache per token as MHA / its GQA / MQA)
      5. what is missing (or "every section present")
"""

from __future__ import annotations

from headcount.report.sections import Accounts, Claim, ReportData, Role
from headcount.report.verdicts import ROLE_NAMES, head_name, role_score

_MARK = {"held": "held", "partly": "partly", "did not hold": "NOT held", "not measured": "n/a"}


def _roles_line(roles: dict[str, Role] | None) -> str:
    if not roles:
        return "heads per role: not available"
    counts = [f"{r.replace('_', '-')} {len(roles[r].heads)}" for r in ROLE_NAMES if r in roles]
    return "heads per role: " + ", ".join(counts)


def _top_line(roles: dict[str, Role] | None, k: int = 4) -> str:
    if not roles:
        return "top heads: not available"
    tops = []
    for r in ROLE_NAMES:
        if r in roles and roles[r].heads:
            score = role_score(roles[r], roles[r].heads[0])
            tops.append((score if score is not None else 0.0, r, roles[r].heads[0]))
    if not tops:
        return "top heads: no head passed a role's threshold"
    tops.sort(key=lambda t: -t[0])
    return "top heads: " + ", ".join(f"{r.replace('_', '-')} {head_name(h)} {s:.2f}" for s, r, h in tops[:k])


def _claims_line(claims: list[Claim]) -> str:
    held = sum(c.status == "held" for c in claims)
    measured = sum(c.status != "not measured" for c in claims)
    parts = ", ".join(f"{c.id} {_MARK.get(c.status, c.status)}" for c in claims)
    return f"chapter claims held: {held} of {len(claims)} ({measured} measured: {parts})"


def _accounts_line(accounts: Accounts | None) -> str:
    if accounts is None or not accounts.rows:
        return "accounts: not available"
    parts = [f"{r.label}{' (this model)' if r.is_model else ''} {r.kv_bytes_per_token:,}" for r in accounts.rows]
    return f"KV cache bytes/token ({accounts.dtype}): " + ", ".join(parts)


def _missing_line(unavailable: dict) -> str:
    if not unavailable:
        return "every section present"
    return "not available: " + ", ".join(sorted(unavailable))


def summary_lines(report: dict) -> list[str]:
    """The five lines of a report.json of this FORMAT (another version: a one-line ValueError)."""
    data = ReportData.from_json(report)
    return [_roles_line(data.roles), _top_line(data.roles), _claims_line(data.claims),
            _accounts_line(data.accounts), _missing_line(data.unavailable)]
