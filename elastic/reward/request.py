"""What a caller asks of the reward pool about one submission beyond "score this completion".

A submission is ``(token, task id, completion)``; a :class:`Request` may come with it:

* ``feedback`` (multi-turn RL, ``rl.feedback``): the pool puts the verifier's feedback for that
  mode into ``Result.feedback``. It is made in the pool, where the task is at hand (code_opt's
  failing test input and expected output come from the problem's test files, which the trainer
  does not have), cut to ``feedback_bytes`` UTF-8 bytes (elastic/reward/feedback.py). The token
  cap (``rl.feedback_max_tokens``) stays on the trainer, which has the tokenizer.
* ``reset`` / ``history`` (a user environment, ``rl.env``; elastic/reward/verifiers/user_env.py):
  ``reset`` asks for the episode's first user message (the completion is ignored); otherwise
  the completion is the episode's next answer and ``history`` its earlier answers, which the
  actor replays before stepping the new one (any actor can score any turn).

The request is part of the submission's identity for dedup only where it changes the answer
(an environment's history); the feedback mode does not: one evaluation serves every mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

FEEDBACK_BYTES = 1024  # the default byte budget of one feedback message


@dataclass(frozen=True)
class Request:
    feedback: str = ""  # "" (none) | verdict | details (elastic/reward/feedback.py MODES)
    feedback_bytes: int = FEEDBACK_BYTES
    reset: bool = False  # rl.env: the first user message of the episode (the completion is ignored)
    history: Tuple[str, ...] = ()  # rl.env: the episode's earlier answers, oldest first

    def __post_init__(self) -> None:
        if self.feedback not in ("", "verdict", "details"):
            raise ValueError(f"Request.feedback must be '', 'verdict' or 'details', got {self.feedback!r}")
        if self.feedback_bytes < 16:
            raise ValueError(f"Request.feedback_bytes must be >= 16 (a verdict and the truncation marker), "
                             f"got {self.feedback_bytes}")
        if self.reset and self.history:
            raise ValueError("Request: a reset has no history")
        object.__setattr__(self, "history", tuple(self.history))
