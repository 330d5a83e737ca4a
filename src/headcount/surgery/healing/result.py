"""HealResult: what one heal did and reached, as data (the CLI and the bench only format it).

to_json keys (a contract: the report and saved command results read them): seconds, forward_equivalents, tokens, steps, and the held-out perplexity
per domain before the edit (the teacher), after the edit (the student as handed in) and after healing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HealResult:
    steps: int  # optimizer steps taken (early stopping may end the run before the planned steps)
    planned_steps: int
    tokens: int  # distinct calibration tokens drawn (training + validation windows)
    tokens_seen: int  # training tokens the student saw, with repeats
    validation_tokens: int
    lr: float
    params: str  # "attention", "all" or "lora"
    layers: list[int]  # the layers whose weights moved ("all": every layer)
    trainable_params: int
    seconds: float = 0.0
    forward_equivalents: float = 0.0  # one-token forwards / `tokens` (a backward counted as two forwards)
    val_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, mean KL nats/position)
    train_losses: list[float] = field(default_factory=list)  # one per step
    best_step: int = 0  # the step whose weights were kept (lowest validation KL)
    stopped_early: bool = False
    held_out: dict | None = None  # {"before_edit": {domain: ppl}, "after_edit": {...}, "after_heal": {...}}
    teacher: str | None = None
    lora_rank: int | None = None
    # heal(checkpoints=...): [{"steps", "tokens_seen", "seconds", "val_kl", "held_out": {domain: ppl}}], the weights
    # of that moment in the one run
    curve: list[dict] = field(default_factory=list)
    world_size: int = 1  # data-parallel ranks (torchrun)
    checkpoint_layers: bool = False  # the student's layers recomputed in backward (memory)
    # a validation measurement with no new best: the run went back to the best weights and scaled its lr by
    # loop.BACKOFF: [(step, the peak lr from then on)]
    backoffs: list[tuple[int, float]] = field(default_factory=list)
    calibration: str = "mixed"  # what was distilled on: "mixed" (the default corpus), "text" (a user's), "windows"
    window: int | None = None  # tokens per training window
    batch_size: int | None = None  # windows per optimizer step
    config: dict | None = None  # the HealConfig the run was given, whole (HealConfig.to_json)

    @property
    def val_first(self) -> float | None:
        return self.val_losses[0][1] if self.val_losses else None

    @property
    def val_best(self) -> float | None:
        return min(v for _, v in self.val_losses) if self.val_losses else None

    def metadata(self) -> dict:
        """What a saved healed model records (headcount.json's "healing")."""
        return {"teacher": self.teacher, "steps": self.steps, "tokens": self.tokens, "tokens_seen": self.tokens_seen,
                "lr": self.lr, "calibration": self.calibration, "window": self.window, "batch_size": self.batch_size,
                "moved": {"params": self.params, "layers": self.layers, "trainable_params": self.trainable_params,
                          **({"lora_rank": self.lora_rank} if self.lora_rank else {})},
                "objective": "KL(teacher || student) of next-token distributions"}

    def to_json(self) -> dict:
        return {
            "seconds": round(self.seconds, 1), "forward_equivalents": round(self.forward_equivalents, 2),
            "tokens": self.tokens, "steps": self.steps, "planned_steps": self.planned_steps,
            "tokens_seen": self.tokens_seen, "validation_tokens": self.validation_tokens, "lr": self.lr,
            "params": self.params, "layers": self.layers, "trainable_params": self.trainable_params,
            "lora_rank": self.lora_rank, "teacher": self.teacher, "calibration": self.calibration,
            "window": self.window, "batch_size": self.batch_size,
            "val_kl_first": self.val_first, "val_kl_best": self.val_best, "best_step": self.best_step,
            "stopped_early": self.stopped_early,
            "val_losses": [[s, round(v, 6)] for s, v in self.val_losses],
            "held_out": self.held_out,
            "world_size": self.world_size, "checkpoint_layers": self.checkpoint_layers,
            "lr_backoffs": [[s, v] for s, v in self.backoffs],
            **({"curve": self.curve} if self.curve else {}),
            **({"config": self.config} if self.config is not None else {}),
        }
