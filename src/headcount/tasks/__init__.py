"""What a model's generated code DOES: problems, the sandbox that runs it, pass@k.

    load_problems("humaneval" | path, limit=None) -> [Problem]      problems.py (TaskError, TASKS, task_label)
    read_completions(path, problems) -> [Completion]                 problems.py
    run_program(source, timeout=10.0, ...) -> ExecResult             sandbox.py (isolation, SandboxUnavailable)
    score(problems, completions, workers=2) -> [ScoredSample]        scoring.py (program, pass_at_k, summarize)
    evaluate(...) -> EvalResult                                      harness.py: generation, then score
    FORMATS, choose_format                                           formats.py (the table), prompts.py
    sanitize.sanitize(code, entry_point) -> str                      EvalPlus's reading of an answer
    wilson_interval, mcnemar_exact, bootstrap_interval, paired       stats.py: how sure, and paired comparisons

Read-only like analysis: it generates and scores, never changes a weight. Lazy exports keep imports cheap
(nothing here imports torch until evaluate is asked for).
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {
    "load_problems": "problems", "Problem": "problems", "TaskError": "problems", "TASKS": "problems",
    "task_label": "problems", "read_completions": "problems", "Completion": "problems",
    "run_program": "sandbox", "isolation": "sandbox", "SandboxUnavailable": "sandbox", "ExecResult": "sandbox",
    "program": "scoring", "pass_at_k": "scoring", "score": "scoring", "summarize": "scoring",
    "ScoredSample": "scoring",
    # generation + scoring (evaluate.py)
    "evaluate": "harness", "evaluate_completions": "harness", "EvalResult": "harness", "Settings": "harness",
    "FORMATS": "formats", "EvalFormat": "formats", "choose_format": "prompts",
    "wilson_interval": "stats", "mcnemar_exact": "stats", "bootstrap_interval": "stats", "paired": "stats",
    "Paired": "stats",
}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
