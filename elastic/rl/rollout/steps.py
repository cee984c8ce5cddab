"""What a step's completions are, wherever they are generated: for 0-based step s, every
completion k (0..N-1) with its problem, its prompt's token ids, its sampling seed and its key at
the reward service. The colocated trainers and the disaggregated fleet's coordinator build the
same rows from the same config, so the two placements sample the same completions.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from elastic.data.chat import ChatFormat, prompt_segments, tokenize_segments
from elastic.data.tokenizer import from_json, plain_copy
from elastic.rl.prompts import PromptStream, flat, group_of, rank_completions
from elastic.rl.seeds import rollout_seed


def message_tokens(rl: Any, tok: Any, chat: ChatFormat, eos_id: int, text: str) -> List[int]:
    """A first user message as the policy's input: in the SFT chat format (rl.prompt_format=chat),
    or the text as is (raw: base models, code continuation). The planner's prompts and, with
    rl.env, the environment's first messages (on the trainers and on a rollout actor) come this way."""
    if rl.prompt_format == "raw":
        return list(plain_copy(tok).encode(text, add_special_tokens=True).ids)
    segs = prompt_segments([{"role": "user", "content": text}], chat)
    return tokenize_segments(segs, tok, int(eos_id))[0]


class StepPlanner:
    """Rows of a step (see the module docstring) and which rank trains which."""

    def __init__(self, cfg: Any, prompt_texts: Dict[str, str], train_ids: Sequence[str], tokenizer_json: str,
                 chat: ChatFormat, eos_id: int) -> None:
        self.rl = cfg.rl
        self.seed = cfg.run.seed
        self.run_name = cfg.run.name
        self.prompt_texts = prompt_texts
        self.stream = PromptStream(tuple(train_ids), cfg.run.seed)
        self.tok = from_json(tokenizer_json)
        self.chat = chat
        self.eos_id = int(eos_id)
        self.N = self.rl.prompts_per_step * self.rl.group_size
        self._ids: Dict[str, List[int]] = {}

    def prompt_tokens(self, problem: str) -> List[int]:
        """The policy's input for a task: its prompt as a user message in the SFT chat format
        (rl.prompt_format=chat), or the prompt text as is (raw: base models, code continuation)."""
        if problem not in self._ids:
            self._ids[problem] = self.text_tokens(self.prompt_texts[problem])
        return self._ids[problem]

    def text_tokens(self, text: str) -> List[int]:
        """A first user message as the policy's input (rl.prompt_format, as `prompt_tokens`; rl.env's
        reset message comes this way)."""
        return message_tokens(self.rl, self.tok, self.chat, self.eos_id, text)

    def prompts(self, step: int):
        return self.stream.step(step, self.rl.prompts_per_step)

    def rows(self, step: int, ks: Sequence[int]) -> List[Dict[str, Any]]:
        """{k, problem, prompt, seed, key, step_prompt_len} for completions `ks` of `step`
        (`step_prompt_len`: the step's longest prompt, every rank's: multi-turn episodes' room,
        elastic/rl/episodes.py episode_sampling, the same however the step is split)."""
        prompts = self.prompts(step)
        longest = max(len(self.prompt_tokens(p)) for _, p in prompts)
        out = []
        for k in ks:
            slot, sample = group_of(k, self.rl.group_size)
            problem = prompts[slot][1]
            out.append({"k": k, "problem": problem, "prompt": self.prompt_tokens(problem),
                        "seed": rollout_seed(self.seed, step, slot, sample), "key": f"{self.run_name}:{step}:{k}",
                        "step_prompt_len": longest})
        return out

    def rank_parts(self, world: int) -> List[List[int]]:
        """Each rank's completions, flat, in the order it generates and trains them."""
        return [flat(rank_completions(self.N, self.rl.minibatches_per_update, world, r)) for r in range(world)]
