"""The teacher role of OPD on language models: a clean expert behind the noise of §B.1.

The clean expert is a causal LM (a hub id or a local directory, sharing the student's
tokenizer) or ``"program"``: the task's own rule at every state — for a chain, the digit that
continues it from the digits written so far (`troupe.envs.chain.next_step`), then the end
token; for any other task with an ``answer``, that answer token by token. Either way the
teacher sees it through `kernels.noisy_logprobs`, π̃ = (1-ε)·π* + ε·ν, and offers the two
access modes of §B.1:

- logit access, `distributions`: log π̃ ``[B, C, V]`` at every position of the student's
  completions, and log π̃ of the tokens the student sampled (the sampled reverse KL's term);
- sample access, `votes`: m draws from π̃ at every position and their majority.

`trajectories` samples whole answers from π̃ (offline BC's data; at a low temperature,
sequence KD's). Every call counts the teacher tokens it used (positions scored, or draws).
"""

from __future__ import annotations

from typing import Any

import torch

from troupe.actors.base import configure_threads
from troupe.actors.logprobs import positions_from_mask, score_completions
from troupe.actors.models import load_causal_lm, load_tokenizer, model_config_or_error
from troupe.actors.rollout_hf import completion_mask
from troupe.actors.sampling import chat_format
from troupe.actors.scorer import as_batch
from troupe.algorithms.opd.kernels import NoiseConfig, answer_ids, majority_targets, noisy_logprobs
from troupe.envs.chain import next_step
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError

PROGRAM = "program"


def check_same_vocabulary(student: Any, teacher: Any, student_path: str, teacher_path: str) -> None:
    """Distillation compares distributions token by token: the two tokenizers must be one."""
    if student.get_vocab() != teacher.get_vocab():
        raise ConfigError(
            f"teacher.path={teacher_path!r} has a vocabulary of {len(teacher)} tokens and the student "
            f"({student_path!r}) one of {len(student)}, and they differ: distillation needs a shared "
            "tokenizer (a teacher trained from the student's, or a model of the same family)")


class NoisyTeacher:
    """The noisy expert as an actor; ``expert`` is a model path or ``"program"``."""

    def __init__(self, expert: str, student_path: str, noise: dict[str, Any] | NoiseConfig,
                 device: str = "cpu", micro_batch_size: int = 64, dtype: str = "float32", top_k: int = 0) -> None:
        """``top_k`` > 0 sends the ``top_k`` most likely tokens of π̃ at each position (ids and
        log-probs) instead of the whole distribution: a 150k-token vocabulary's distributions
        are too large to move, and the learner rebuilds them (`targets_from_topk`).

        Every draw (a trajectory's tokens, a vote) comes from a generator seeded by its call's
        ``seed``: an arm's teacher noise is a function of (run seed, step, arm) alone, the same
        whichever other arms share the teacher and in whatever order they call it."""
        configure_threads()
        self.noise = noise if isinstance(noise, NoiseConfig) else NoiseConfig(**noise)
        self.tokenizer = load_tokenizer(student_path)
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.expert = expert
        self.model = None
        if expert != PROGRAM:
            self.model, tok = load_causal_lm(expert, dtype, self.device)
            self.model.eval()
            check_same_vocabulary(self.tokenizer, tok, student_path, expert)
        # The student's logits' width, which the teacher's distributions must have: a model's
        # embedding is often padded past its tokenizer (and differs between sizes of one family).
        self.vocab = int(model_config_or_error(student_path, "model.path", "the student").vocab_size)
        self.top_k = top_k
        if self.noise.kernel == "topk" and self.noise.top_k > self.vocab:
            raise ConfigError(f"teacher.noise.top_k={self.noise.top_k} is larger than the vocabulary "
                              f"({self.vocab} tokens)")
        self.answer = answer_ids(self.tokenizer, self.noise.answer_tokens)
        self.digit_ids = answer_ids(self.tokenizer, [str(d) for d in range(10)]) if self.model is None else []
        self.digit_of = {i: d for d, i in enumerate(self.digit_ids)}
        self.micro_batch_size = micro_batch_size
        self.tokens_used: dict[str, int] = {}

    # -- the clean expert -----------------------------------------------------------------
    def _program_next(self, row: dict, written: list[int]) -> int:
        """The program expert's next token id after the completion ids ``written``."""
        eos = self.tokenizer.eos_token_id
        if "inputs" in row and "kind" in row:  # a chain: continue it from the digits written so far
            digits = [self.digit_of[i] for i in written if i in self.digit_of]
            nxt = next_step(row, digits)
            return eos if nxt is None else self.digit_ids[nxt]
        if "answer" not in row:
            raise ConfigError("teacher.path=program reads each row's chain inputs or its 'answer': this task's rows "
                              "have neither; give the teacher a model path")
        answer = self.tokenizer(str(row["answer"]), add_special_tokens=False)["input_ids"] + [eos]
        return answer[len(written)] if len(written) < len(answer) else eos

    def clean_logprobs(self, batch: Batch) -> torch.Tensor:
        """log π* ``[B, C, V]`` at every completion position of ``batch``."""
        ids = batch["completion_ids"]
        B, C = ids.shape
        if self.model is not None:
            return self._width(score_completions(self.model, batch.to(self.device), 1.0, self.micro_batch_size,
                                                 with_distribution=True)["distribution"].cpu())
        out = torch.full((B, C, self.vocab), float("-inf"))
        for i, row in enumerate(batch.objects["row"]):
            written = ids[i].tolist()
            for t in range(C):
                out[i, t, self._program_next(row, written[:t])] = 0.0
        return out

    def _next_clean(self, ids: torch.Tensor, mask: torch.Tensor, rows: list[dict], prompt_len: int) -> torch.Tensor:
        """log π* ``[B, V]`` of the next token after the completions so far (``ids[:, prompt_len:]``)."""
        if self.model is not None:
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                             position_ids=positions_from_mask(mask).to(self.device), use_cache=False)
            return self._width(torch.log_softmax(out.logits[:, -1].float(), -1).cpu())
        clean = torch.full((len(rows), self.vocab), float("-inf"))
        for i, row in enumerate(rows):
            clean[i, self._program_next(row, ids[i, prompt_len:].tolist())] = 0.0
        return clean

    def _width(self, logprobs: torch.Tensor) -> torch.Tensor:
        """The teacher's log-distribution over the student's ``vocab`` ids: the padding rows past
        either tokenizer hold no token, so they are cut, or given no mass."""
        V = logprobs.shape[-1]
        if V > self.vocab:
            return torch.log_softmax(logprobs[..., : self.vocab], -1)
        if V < self.vocab:
            pad = logprobs.new_full((*logprobs.shape[:-1], self.vocab - V), float("-inf"))
            return torch.cat([logprobs, pad], -1)
        return logprobs

    # -- the access modes -------------------------------------------------------------------
    def _count(self, key: str, n: int) -> None:
        self.tokens_used[key] = self.tokens_used.get(key, 0) + int(n)

    @torch.no_grad()
    def distributions(self, batch: Batch | list[Any], key: str = "") -> Batch:
        """Logit access: ``batch`` with ``targets`` = log π̃ ``[B, C, V]`` and ``teacher_logprobs``
        = log π̃ of the completion's own tokens ``[B, C]`` (0 past the end)."""
        batch = as_batch(batch)
        noisy = noisy_logprobs(self.clean_logprobs(batch), self.noise, self.answer)
        mask = batch["completion_mask"]
        self._count(key, mask.sum())
        sampled = noisy.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
        sampled = torch.where(mask.bool(), sampled, torch.zeros_like(sampled)).float()
        if self.top_k:
            vals, idx = noisy.float().topk(min(self.top_k, self.vocab), dim=-1)
            return batch.with_fields(targets_topk_logprobs=vals, targets_topk_ids=idx, teacher_logprobs=sampled)
        return batch.with_fields(targets=noisy.float(), teacher_logprobs=sampled)

    @torch.no_grad()
    def votes(self, batch: Batch | list[Any], votes: int, key: str = "", seed: int = 0) -> Batch:
        """Sample access: ``batch`` with ``target_ids`` ``[B, C]``, the majority of ``votes``
        draws from π̃ at every position (drawn by a generator seeded with ``seed``)."""
        batch = as_batch(batch)
        noisy = noisy_logprobs(self.clean_logprobs(batch), self.noise, self.answer)
        self._count(key, batch["completion_mask"].sum() * votes)
        return batch.with_fields(target_ids=majority_targets(noisy, votes, torch.Generator().manual_seed(seed)))

    @torch.no_grad()
    def trajectories(self, rows: list[dict], temperature: float, max_new_tokens: int, key: str = "",
                     clean: bool = False, seed: int = 0) -> Batch:
        """One answer per row sampled from π̃ (π* with ``clean``) at ``temperature`` (0: greedy)
        by a generator seeded with ``seed``, as a Batch in the rollout engines' layout, so a
        learner trains on it as on a rollout; its ``target_ids`` are the answer itself (BC:
        cross-entropy on the teacher's tokens)."""
        tok = self.tokenizer
        generator = torch.Generator().manual_seed(seed)
        prompts = [r["prompt"] for r in rows]
        enc = tok(chat_format(tok, prompts, True, rows), return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        P = ids.shape[1]
        done = torch.zeros(len(rows), dtype=torch.bool)
        for _ in range(max_new_tokens):
            lp = self._next_clean(ids, mask, rows, P)
            if not clean:
                lp = noisy_logprobs(lp, self.noise, self.answer)
            if temperature == 0:
                nxt = lp.argmax(-1)
            else:
                probs = torch.softmax(lp.double() / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
            ids = torch.cat([ids, nxt.unsqueeze(1)], 1)
            mask = torch.cat([mask, (~done).long().unsqueeze(1)], 1)
            done |= nxt == tok.eos_token_id
            if done.all():
                break
        completion = ids[:, P:]
        cmask = completion_mask(completion, tok.eos_token_id, tok.pad_token_id)
        self._count(key, cmask.sum())
        texts = [tok.decode(c[m.bool()], skip_special_tokens=True) for c, m in zip(completion, cmask, strict=True)]
        return Batch({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"],
                      "completion_ids": completion, "completion_mask": cmask,
                      "logprobs": torch.zeros(completion.shape), "target_ids": completion},
                     {"prompt": prompts, "completion": texts, "row": list(rows)}, {"tokens": int(cmask.sum())})

    def usage(self) -> dict[str, int]:
        """Teacher tokens used so far, by key (an arm of the comparison)."""
        return dict(self.tokens_used)

    def get_state(self) -> dict[str, Any]:
        """Tokens used (the draws are seeded by each call: a resumed run draws what this one would)."""
        return {"tokens_used": dict(self.tokens_used)}

    def set_state(self, state: dict[str, Any]) -> bool:
        self.tokens_used = {k: int(v) for k, v in state["tokens_used"].items()}
        return True
