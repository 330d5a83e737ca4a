"""What `headcount bench serve` measures: one ServeRow per engine x model x context x batch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

ENGINES = ("headcount", "llamacpp", "vllm")
# the keys of each row of `bench serve --json`, in order: a contract with its users
ROW_KEYS = ("engine", "model", "edited", "context", "batch", "kv_bytes", "peak_rss_bytes", "prefill_tokens_per_s",
            "decode_tokens_per_s", "predicted_kv_ratio", "predicted_prefill_speedup", "predicted_decode_speedup")


class EngineUnavailable(RuntimeError):
    """An engine that cannot run here: one line saying why (and the make target that installs it)."""


@dataclass
class ServeRow:
    engine: str
    model: str
    edited: str | None  # the edited directory; None for the unedited model
    context: int
    batch: int
    kv_bytes: int | None  # the KV cache bytes the engine itself allocates for this context x batch
    peak_rss_bytes: int | None
    prefill_tokens_per_s: float | None  # batch x context / the time to the first new token of every row
    decode_tokens_per_s: float | None  # batch x new tokens / their time (every row's tokens counted)
    predicted_kv_ratio: float | None  # the accounts' edit / unedited (None on the unedited row)
    predicted_prefill_speedup: float | None
    predicted_decode_speedup: float | None
    notes: list[str] = field(default_factory=list)  # not in --json's rows: shown under the table

    def to_json(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in ROW_KEYS}


@dataclass
class ServeResult:
    rows: list[ServeRow]
    skipped: dict[str, str]  # engine -> why it did not run (one line)
    capacity: list[dict]  # vLLM's own KV capacity per model (tokens, requests at once) and the accounts'
    cpu: str
    settings: dict

    @classmethod
    def from_json(cls, d: dict) -> "ServeResult":
        """Back from `bench serve --json` (to redraw its table or PNG without measuring again)."""
        notes = d.get("notes", {})
        rows = [ServeRow(**r, notes=notes.get(f"{r['engine']} {r['edited'] or r['model']} {r['context']}x{r['batch']}", []))
                for r in d["rows"]]
        return cls(rows, d.get("skipped", {}), d.get("capacity", []), d.get("cpu", ""), d.get("settings", {}))

    def to_json(self) -> dict:
        return {"rows": [r.to_json() for r in self.rows], "skipped": self.skipped, "capacity": self.capacity,
                "notes": {f"{r.engine} {r.edited or r.model} {r.context}x{r.batch}": r.notes
                          for r in self.rows if r.notes},
                "cpu": self.cpu, "settings": self.settings}
