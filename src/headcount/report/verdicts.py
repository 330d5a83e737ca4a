"""The words every claim reader shares (claims_*.py): a claim's dict, its statuses, where a number came from, an
edit's held-out quality stated one way, the three held-out domains as a table and a sentence.

    claim(cid, title, claim, test, status, finding, number=None, source=None) -> the claim's JSON
    quality(before, after, cosine=None, max_rise=inf) -> (within the limit, words, number) | None
    command_source(edit, model) / experiment_source(experiment) / run_source(model) -> words
    domain_table(edit_or_pruning) -> [(domain, before, after)];  domain_finding(...) -> "; on the other ..."

Sections may be given as their dataclass (sections.py) or their JSON (the page passes JSON).
"""

from __future__ import annotations

from headcount.report.measures.edits import Domains, Edit
from headcount.report.measures.experiments import Experiment

HELD, PARTLY, NOT_HELD, NOT_MEASURED = "held", "partly", "did not hold", "not measured"
STATUSES = (HELD, PARTLY, NOT_HELD, NOT_MEASURED)
NOT_AVAILABLE = "not available in this report"
PRUNE_COSINE = 0.95  # (encoders) an edit keeps held-out sentence embeddings at least this close to the original's
ROLE_NAMES = ("previous_token", "duplicate_token", "induction", "positional", "syntactic", "rare_word", "sink")


def claim(cid, title, claim, test, status, finding, number=None, source=None) -> dict:
    return {"id": cid, "title": title, "claim": claim, "test": test, "status": status, "finding": finding,
            "number": number, "source": source or NOT_AVAILABLE}


def run_source(model: str | None) -> str:
    return f"measured on {model or 'the model'} in this report's run"


def experiment_source(section: Experiment | dict | None) -> str | None:
    """Where an experiment's numbers came from, in words (None when the section is missing)."""
    if not section:
        return None
    section = Experiment.from_json(section)
    seeds, steps = section.seeds, section.steps
    size = ", ".join(x for x in (f"{seeds} seed{'s' if seeds != 1 else ''}" if seeds else "",
                                 f"{steps} steps" if steps else "") if x)
    if section.source == "saved":
        return (f"the experiment's full run saved in {section.path} ({size}; `{section.command}`), "
                "a small model trained from scratch")
    return (f"the experiment's --quick run ({size}; `{section.command}`), run by this report and cached; "
            "a small model trained from scratch")


def quality(before: float | None, after: float | None, cosine: float | None = None,
            max_rise: float = float("inf")) -> tuple[bool, str, float] | None:
    """An edit's held-out quality, stated one way by every claim (C11, C12, C15): (within the limit, the words,
    the number). Decoders: perplexity before -> after, the number its relative rise, within when <= max_rise;
    encoders: the mean cosine of held-out sentence embeddings to the unmodified model's, within when
    >= PRUNE_COSINE. None when neither was measured."""
    if before and after is not None:
        rise = after / before - 1
        return rise <= max_rise + 1e-12, f"held-out perplexity {before:.2f} -> {after:.2f} ({rise:+.1%})", rise
    if cosine is not None:
        return cosine >= PRUNE_COSINE, f"held-out sentence embeddings at mean cosine {cosine:.3f}", cosine
    return None


def limit_words(decoder: bool, max_rise: float) -> str:
    return (f"held-out perplexity up by <= {max_rise:.0%}" if decoder else
            f"held-out sentence embeddings at mean cosine >= {PRUNE_COSINE} to the unmodified model's")


def command_source(section: Edit | dict, model: str | None = None) -> str:
    """Where a command section's numbers came from, in words: the command's saved result for these weights, or
    its defaults run by this report (report/commands.py)."""
    section = Edit.from_json(section)
    if section.source == "saved":
        sha = str(section.weights_sha256 or "")
        return (f"saved result of `{section.command}` ({section.path}), measured on these weights (sha256 "
                f"{sha[:12]}...); `python benchmarks/command_results.py --model {model or 'MODEL'}` regenerates it")
    return (f"run by this report: `{section.command}`'s defaults (the functions the command calls, nothing "
            f"overridden) on {model or 'the model'}, measured as the command measures it")


def sizes_words(section: Domains) -> str:
    if not section.domain_sizes or not section.domain_sizes.get("prose"):
        return ""
    n, w = section.domain_sizes["prose"][:2]
    return f" ({n} held-out windows of {w} tokens per domain, as the command measures)"


def domain_table(section: Domains | dict | None) -> list[tuple[str, float, float]]:
    """[(domain, before, after)] of a pruning / merge section's three held-out domains, through
    surgery's own domain_rows (the table `headcount prune` / `merge-kv` print); [] when not measured."""
    from headcount.surgery.cli_common import domain_rows

    if section is None:
        return []
    section = Domains.from_json(section) if isinstance(section, dict) else section
    rows = domain_rows(section.ppl_by_domain_before, section.ppl_by_domain_after)
    return [(label.rsplit(": ", 1)[-1], before, after) for label, before, after in rows
            if before is not None and after is not None]


def domain_finding(section: Domains | dict | None) -> str:
    """'; on the other held-out domains: code a -> b (+x%), source ...' (nothing when not measured)."""
    parts = [f"{name} {b:.2f} -> {a:.2f} ({a / b - 1:+.1%})" for name, b, a in domain_table(section)
             if name != "prose" and b]
    return "; on the other held-out domains: " + ", ".join(parts) if parts else ""


def compensation_words(point) -> str:
    """'compensation lstsq, query' / 'no compensation' of a pruning point or edit."""
    c, mode = point.compensate, point.mode
    s = "with compensation" if c and c not in ("none", False) else "no compensation"
    if isinstance(c, str) and c not in ("none",):
        s = f"compensation {c}"
    return s + (f", {mode}" if mode else "")


def merge_how(merge: Edit | dict) -> str:
    """The merge's settings in words: 'method aware, 60 local steps per layer, a 20-step uptrain distilled from the
    unmerged model'."""
    merge = Edit.from_json(merge)
    opts, up = merge.options or {}, merge.uptrain or {}
    bits = [f"method {merge.method or 'aware'}"]
    if opts.get("local_steps"):
        bits.append(f"{opts['local_steps']} local reconstruction steps per layer")
    if up.get("steps"):
        bits.append(f"a {up['steps']}-step uptrain distilled from the unmerged model")
    elif merge.method == "mean" or opts:
        bits.append("no training")
    return ", ".join(bits)


def head_name(entry) -> str:
    """[layer, head(, extra)] -> 'L16 H0 (+1)'."""
    s = f"L{entry[0]} H{entry[1]}"
    if len(entry) > 2 and entry[2] is not None:
        extra = entry[2]
        s += f" ({extra:+d})" if isinstance(extra, int) else f" ({extra})"
    return s


def role_score(role, entry) -> float | None:
    """A role's score of the head `entry` names ([layer, head, ...]); role: sections.Role or its JSON."""
    scores = role["scores"] if isinstance(role, dict) else role.scores
    try:
        return float(scores[entry[0]][entry[1]])
    except (IndexError, TypeError, ValueError):
        return None
