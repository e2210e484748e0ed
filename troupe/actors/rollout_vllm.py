"""Rollout engine on vLLM (GPU): the hf engine's interface on vLLM's offline `LLM`.

``generate(prompts, sampling, rows, seed) → Batch`` with the same fields, padding and masks
as `HFRolloutEngine`, so the learner and reward actors cannot tell the backends apart;
``load_weights(update)`` installs a learner's published weights in the running engine.

vLLM is imported when an engine is built, never when this module is imported: CPU machines
import it freely (`rollout_class("vllm")`, tests) and get a `ConfigError` naming
``pip install -e ".[gpu]"`` only if they try to build one.

How the engine runs (vLLM >= 0.10.2):

- One engine is one `LLM` with tensor-parallel size 1, its engine core in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set even over an inherited ``1``): it lives on the GPU
  share Ray gave this actor, dies with it, and `LLM.collective_rpc` hands tensors to the worker
  by reference.
- bf16 by default (``rollout.dtype``): vLLM's float32 path runs without FlashAttention, on a
  slower attention backend. The learner keeps its own dtype, so with a bf16 engine and a float32
  learner the config requires ``learner.recompute_old_logprobs`` (`check_config`).
- Text only: a row's ``"frames"`` are refused with a clear error (vLLM's multimodal inputs are
  not wired up); use ``rollout.backend=hf`` for a vision-language policy.
- Prompts are chat-formatted and tokenized here with troupe's own tokenizer (the learner's),
  and vLLM gets token ids with ``skip_tokenizer_init=True``: vLLM's own tokenizer loading can
  rebuild a locally trained tokenizer with other ids. vLLM stops on the EOS id we pass; stop
  strings are applied here, after generation, by cutting each completion after the token
  that completes the first stop string (the same place the hf engine's stopping criterion
  stops; the tokens past it are generated and dropped).
- Each row gets its own sampling seed derived from ``(seed, row)``, so a call is reproducible
  and the copies of a prompt in a group still differ.

Log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob, and the engine
must run with ``logprobs_mode="processed_logprobs"`` (set in `engine_kwargs`; the default,
``raw_logprobs``, is the unprocessed ``T = 1`` distribution): in vLLM >= 0.10.2 that is the
log-softmax of the logits after vLLM's sampler has applied, in this order, the repetition
penalty, temperature, min-p, top-k and top-p (`PROCESSED_ORDER`), the order and rules of
`troupe.actors.logit_processing`, with which the hf engine samples and the learner and scorers
recompute; truncated tokens are renormalised away. As read in vLLM's sampler: the repetition
penalty counts prompt and generated tokens and divides positive logits (multiplies negative
ones); min-p compares the tempered probabilities with ``min_p · p_max``; top-k keeps ties at
the k-th logit; top-p drops the smallest tokens whose renormalised mass is ``<= 1 - top_p``,
never the last; with processed log-probs vLLM never takes its FlashInfer sampling path.
vLLM 0.10.0–0.10.1 take the log-probs before temperature and earlier versions return the raw
ones: `require_vllm` accepts only the range this was read against (`VLLM_RANGE`, the ``gpu``
extra's pin). Kernels differ from the learner's in any case (bf16, fused attention), and a
token at the edge of a top-p or min-p set may fall on the other side of it in the learner, so
for exact importance ratios set ``learner.recompute_old_logprobs=true``: the learner then
recomputes π_old itself and the engine's log-probs only feed metrics.

Weights: the transport that made an update installs it with one of the engine's primitives.
Full weights (`install_state`) go to the model's own ``load_weights`` (it takes Hugging Face
parameter names and fuses q/k/v and gate/up itself) through a worker extension
(`TroupeWorkerExtension`, its methods always called by name with `LLM.collective_rpc`: a
callable passed instead receives vLLM's worker wrapper, not the worker, so what it sets is not
where the extension reads it); nccl updates arrive by broadcast into the same call
(`install_broadcast`, `troupe.actors.transport.nccl`). LoRA
adapters (`install_adapter`) are merged into the base weights here, ``W = W0 + (alpha / r) · B A``,
and loaded as full weights of the adapted modules: the engine needs no LoRA configuration,
generation runs at base-model speed, and only the adapter crosses the network. After every
update the prefix cache is reset, as its KV blocks were computed with the old weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from troupe.actors.base import configure_threads
from troupe.actors.models import chat_template_text, load_tokenizer
from troupe.actors.sampling import (  # noqa: F401  (chat_format: part of this module's API)
    SamplingConfig,
    chat_format,
    check_option_letters,
    left_padded,
    letter_token_id,
    sampling_and_rows,
    turn_prompts,
)
from troupe.actors.transport import nccl
from troupe.actors.transport.base import WeightUpdate
from troupe.platform.batch import Batch
from troupe.platform.config import check
from troupe.platform.errors import ConfigError
from troupe.platform.registry import TRANSPORTS

MIN_VLLM = (0, 10, 2)  # processed_logprobs after temperature; worker_extension_cls; collective_rpc
# The first release past those this module was read against (0.10.2 to 0.12): the `gpu` extra
# pins the same range (a test checks that the two agree).
MAX_VLLM = (0, 13)
INSTALL = 'pip install -e ".[gpu]"'
# What vLLM's processed_logprobs have gone through, in its sampler's order; troupe's
# `process_logits` applies the same options in the same order.
PROCESSED_ORDER = ("repetition_penalty", "temperature", "min_p", "top_k", "top_p")
DEFAULT_DTYPE = "bfloat16"
WORKER_EXTENSION = "troupe.actors.rollout_vllm.TroupeWorkerExtension"
DTYPES = ("float32", "bfloat16", "float16")
_LORA_PREFIX = "base_model.model."


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


VLLM_RANGE = f">={_dotted(MIN_VLLM)},<{_dotted(MAX_VLLM)}"


def check_vllm_version(version: str) -> None:
    """Raise a `ConfigError` naming ``rollout.backend`` unless ``version`` is in `VLLM_RANGE`."""
    from packaging.version import Version

    release = Version(version).release
    if not MIN_VLLM <= release < MAX_VLLM:
        raise ConfigError(
            f"rollout.backend=vllm needs vLLM {VLLM_RANGE} (the versions whose sampler, log-prob modes and "
            f"worker calls troupe was written and checked against), found {version}: {INSTALL}, or "
            f"pip install 'vllm{VLLM_RANGE}'")


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, read from its package metadata without importing it; None without one."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def require_vllm() -> Any:
    """The ``vllm`` module, or a `ConfigError` that says what to install or change."""
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(
            f"rollout.backend=vllm needs vLLM, which is not installed in this environment: run {INSTALL} "
            f"on a machine with a CUDA GPU, or use rollout.backend=hf") from e
    if not torch.cuda.is_available():
        raise ConfigError(
            "rollout.backend=vllm needs a CUDA GPU and this process sees none: give the rollout role a GPU "
            "(rollout.num_gpus > 0) on a GPU node, or use rollout.backend=hf")
    check_vllm_version(vllm.__version__)
    return vllm


def check_config(cfg: Any) -> None:
    """The checks of a policy config (``model``, ``rollout``, ``learner`` sections) with
    ``rollout.backend=vllm``, run in the driver before any actor starts: one `ConfigError`
    naming the key and the fix."""
    rc, lc = cfg.rollout, cfg.learner
    version = installed_vllm_version()
    # The driver may run where vLLM is not installed (a CPU head node): the engine's own
    # `require_vllm` says so on the GPU node. An installed one must be in the range.
    if version is not None:
        check_vllm_version(version)
    check(rc.num_gpus > 0, "rollout.num_gpus", rc.num_gpus,
          "a GPU share > 0 with rollout.backend=vllm (vLLM runs on CUDA only), or rollout.backend=hf")
    # vLLM takes gpu_memory_utilization of the whole GPU, whatever share Ray granted.
    check(rc.gpu_memory_utilization <= rc.num_gpus + 1e-9, "rollout.gpu_memory_utilization",
          rc.gpu_memory_utilization,
          f"at most rollout.num_gpus={rc.num_gpus}: vLLM reserves that fraction of the whole GPU, not of the "
          "role's share, so a larger one takes memory Ray gave to other roles; lower it or raise rollout.num_gpus")
    dtype = engine_dtype(rc)
    check(dtype in DTYPES, "rollout.dtype", rc.dtype, f"one of {DTYPES}, or null for {DEFAULT_DTYPE}")
    check(not getattr(rc.sampling, "explore", 0), "rollout.sampling.explore", rc.sampling.explore,
          "0 with rollout.backend=vllm (its samplers have no ε-greedy mixture), or rollout.backend=hf")
    if dtype != lc.dtype and not lc.recompute_old_logprobs:
        raise ConfigError(
            f"config key 'learner.recompute_old_logprobs' = False is not allowed with rollout.backend=vllm in "
            f"{dtype} and learner.dtype={lc.dtype}: the engine's log-probs come from other precision and "
            "kernels than the learner's, so using them as π_old biases the importance ratio. Set "
            f"learner.recompute_old_logprobs=true, or rollout.dtype={lc.dtype}")


def engine_dtype(rollout: Any) -> str:
    """The vLLM engine's dtype: ``rollout.dtype``, bf16 when it is null."""
    return getattr(rollout, "dtype", None) or DEFAULT_DTYPE


def engine_kwargs(model_path: str, dtype: str, seed: int, gpu_memory_utilization: float,
                  enforce_eager: bool = False, max_model_len: int | None = None) -> dict[str, Any]:
    """Arguments of ``vllm.LLM`` for one rollout engine."""
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r}: expected one of {DTYPES}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"rollout.gpu_memory_utilization={gpu_memory_utilization}: expected a number in (0, 1]")
    kw: dict[str, Any] = {
        "model": str(model_path), "dtype": dtype, "seed": seed, "gpu_memory_utilization": gpu_memory_utilization,
        "enforce_eager": enforce_eager, "tensor_parallel_size": 1, "skip_tokenizer_init": True,
        # Log-probs of the distribution sampled from (penalty, temperature, min-p, top-k, top-p
        # applied), as the learner recomputes them; without it vLLM returns the raw T = 1 ones.
        "logprobs_mode": "processed_logprobs", "worker_extension_cls": WORKER_EXTENSION,
    }
    if max_model_len:
        kw["max_model_len"] = max_model_len
    return kw


def row_seeds(seed: int | None, n: int) -> list[int | None]:
    """A 31-bit sampling seed per row from ``(seed, row)``; hashing keeps engines' seeds ``seed + i`` apart."""
    if seed is None:
        return [None] * n
    return [int.from_bytes(hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF
            for i in range(n)]


def sampling_kwargs(sampling: SamplingConfig, n: int, seed: int | None, eos_id: int | None) -> list[dict[str, Any]]:
    """Arguments of ``vllm.SamplingParams`` for each of ``n`` rows (stop strings are applied afterwards)."""
    if sampling.explore:
        raise ConfigError(f"rollout.sampling.explore={sampling.explore}: the vllm engine has no ε-greedy mixture; "
                          "set it to 0 or use rollout.backend=hf")
    # top_k=0, min_p=0 and repetition_penalty=1 are vLLM's own "off" values too.
    base: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                            "min_p": sampling.min_p, "repetition_penalty": sampling.repetition_penalty,
                            "max_tokens": sampling.max_new_tokens, "logprobs": 0, "detokenize": False,
                            "stop_token_ids": [] if eos_id is None else [eos_id]}
    return [{**base, "seed": s} for s in row_seeds(seed, n)]


def encode_prompts(tokenizer: Any, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Left-padded ``(prompt_ids, prompt_mask)`` exactly as the hf engine builds them, and each row's ids unpadded."""
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    return ids, mask, [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def stop_length(tokenizer: Any, ids: Sequence[int], stop: Sequence[str]) -> int:
    """How many tokens to keep: through the token that completes the first stop string, else all."""
    if not stop or not ids:
        return len(ids)

    def hit(k: int) -> bool:
        text = tokenizer.decode(list(ids[:k]), skip_special_tokens=True)
        return any(s in text for s in stop)

    if not hit(len(ids)):
        return len(ids)
    lo, hi = 1, len(ids)  # a longer prefix holds whatever a shorter one does: bisect for the first hit
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def sampled_logprobs(token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position ``{token_id: Logprob}``."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no log-probs although SamplingParams(logprobs=0) asked for them")
    return [float(pos[t].logprob) for t, pos in zip(token_ids, logprobs, strict=True)]


def read_outputs(outputs: Sequence[Any], tokenizer: Any, stop: Sequence[str]) -> tuple[list[list[int]], list[list[float]]]:
    """Token ids and log-probs of each ``RequestOutput``'s first completion, cut at the stop strings."""
    tokens, logprobs = [], []
    for out in outputs:
        c = out.outputs[0]
        ids = [int(t) for t in c.token_ids]
        lps = sampled_logprobs(ids, c.logprobs)
        keep = stop_length(tokenizer, ids, stop)
        tokens.append(ids[:keep])
        logprobs.append(lps[:keep])
    return tokens, logprobs


def completion_tensors(tokens: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]],
                       pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(completion_ids, completion_mask, logprobs)``: pad id and 0 after each row's tokens."""
    B, C = len(tokens), max((len(t) for t in tokens), default=0)
    ids = torch.full((B, C), pad_id, dtype=torch.long)
    mask = torch.zeros((B, C), dtype=torch.long)
    lps = torch.zeros((B, C), dtype=torch.float32)
    for i, (t, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        ids[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        mask[i, :len(t)] = 1
        lps[i, :len(t)] = torch.tensor(lp, dtype=torch.float32)
    return ids, mask, lps


def decode_completions(tokenizer: Any, completion: torch.Tensor, mask: torch.Tensor, stop: Sequence[str]) -> list[str]:
    """Texts of the kept tokens without special tokens, each cut before its first stop string (as the hf engine)."""
    texts = []
    for ids, m in zip(completion.tolist(), mask.tolist(), strict=True):
        text = tokenizer.decode([i for i, keep in zip(ids, m, strict=True) if keep], skip_special_tokens=True)
        for s in stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        texts.append(text)
    return texts


# -- LoRA merged into the base weights ------------------------------------------------------
def lora_targets(adapter: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, str]]:
    """Base weight name → (lora_A key, lora_B key) of a peft adapter state dict."""
    out = {}
    for k in adapter:
        if k.endswith(".lora_A.weight"):
            module = k[: -len(".lora_A.weight")]
            if module + ".lora_B.weight" not in adapter:
                raise ValueError(f"LoRA update has {k!r} without its lora_B")
            out[module.removeprefix(_LORA_PREFIX) + ".weight"] = (k, module + ".lora_B.weight")
        elif not k.endswith(".lora_B.weight"):
            raise ConfigError(f"LoRA update holds {k!r}: the vllm engine merges only lora_A/lora_B of linear "
                              f"layers (no embedding adapters, biases or modules_to_save)")
    return out


def merge_lora(base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor],
               config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The adapted weights ``W0 + s · B A`` with ``s = alpha / r`` (``alpha / sqrt(r)`` for rsLoRA)."""
    if config.get("fan_in_fan_out") or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ConfigError("LoRA with fan_in_fan_out, rank_pattern or alpha_pattern cannot be merged by the vllm engine")
    r = int(config["r"])
    alpha = float(config.get("lora_alpha", 8))  # peft's default
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    merged = {}
    for name, (a, b) in lora_targets(adapter).items():
        w0 = base[name]
        merged[name] = (w0.float() + scale * (adapter[b].float() @ adapter[a].float())).to(w0.dtype)
    return merged


def read_base_weights(model_path: str, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The named tensors from the model's safetensors files (a local directory or a cached hub id)."""
    from safetensors import safe_open

    root = Path(model_path).expanduser()
    if not root.is_dir():
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(model_path, allow_patterns=["*.safetensors", "*.json"]))
    want, out = set(names), {}
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for k in want.intersection(sf.keys()):
                out[k] = sf.get_tensor(k)
    if want - out.keys():
        raise ConfigError(f"LoRA base weights {sorted(want - out.keys())[:5]} are not in the safetensors files "
                          f"of {model_path!r}")
    return out


def refuse_frames(rows: Sequence[Mapping[str, Any]] | None) -> None:
    """Raise a `ConfigError` if a row carries video frames, which this engine would otherwise drop."""
    if rows and any(r.get("frames") is not None for r in rows):
        raise ConfigError("rows carry video frames but rollout.backend=vllm generates from text only (its "
                          "multimodal inputs are not wired up in troupe): use rollout.backend=hf for a "
                          "vision-language policy")


# -- the engine -----------------------------------------------------------------------------
class VLLMRolloutEngine:
    """A vLLM engine that samples completions; one per rollout rank, on one GPU (or a share of one)."""

    # Sizes its KV cache from the GPU memory free when it starts: created before colocated learners.
    starts_before_colocated = True

    def __init__(self, model_path: str, dtype: str = DEFAULT_DTYPE, seed: int = 0, gpu_memory_utilization: float = 0.4,
                 chat: bool = True, enforce_eager: bool = False, max_model_len: int | None = None,
                 chat_template: str | None = None) -> None:
        configure_threads()
        kwargs = engine_kwargs(model_path, dtype, seed, gpu_memory_utilization, enforce_eager, max_model_len)
        vllm = require_vllm()
        # Engine core in this process: the actor's GPU share, tensors passed by reference (see
        # module doc). Assigned, not defaulted: an inherited 1 would start a separate process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.model_path = str(model_path)
        self.tokenizer = load_tokenizer(self.model_path, chat_template)
        self.llm = vllm.LLM(**kwargs)
        self._sampling_params = vllm.SamplingParams
        self.vllm_version = vllm.__version__
        self.chat = chat
        self.seed = seed
        self.version = 0
        self._lora_base: dict[str, torch.Tensor] | None = None

    @classmethod
    def config_kwargs(cls, cfg: Any) -> dict[str, Any]:
        """The constructor arguments taken from an algorithm's config (all but ``model_path``)."""
        rc = cfg.rollout
        return {"dtype": engine_dtype(rc), "seed": cfg.run.seed, "gpu_memory_utilization": rc.gpu_memory_utilization,
                "enforce_eager": bool(getattr(rc, "enforce_eager", False)), "max_model_len": rc.max_model_len,
                "chat_template": chat_template_text(getattr(cfg.model, "chat_template", None))}

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """See the module function `check_config`."""
        check_config(cfg)

    def generate(self, prompts: list[str], sampling: SamplingConfig | dict, rows: list[dict] | None = None,
                 seed: int | None = None, option_letters: list[str] | None = None) -> Batch:
        """Sample one completion per prompt (repeat a prompt G times for a group); with
        ``option_letters`` also each letter's log-prob as the first token (see the hf engine)."""
        sampling = sampling_and_rows(sampling, prompts, rows)
        check_option_letters(option_letters, prompts)
        refuse_frames(rows)
        t0 = time.perf_counter()
        tok = self.tokenizer
        prompt_ids, prompt_mask, unpadded = encode_prompts(tok, chat_format(tok, prompts, self.chat, rows))
        params = [self._sampling_params(**kw) for kw in sampling_kwargs(sampling, len(prompts), seed, tok.eos_token_id)]
        batch = self._sample(unpadded, prompt_ids, prompt_mask, params, prompts, rows, sampling, t0)
        if option_letters is not None:
            batch["option_logprobs"] = self._option_logprobs(unpadded, option_letters)
        return batch

    def generate_turns(self, contexts: list[list[int] | None], messages: list[list[dict]],
                       sampling: SamplingConfig | dict, seed: int | None = None) -> Batch:
        """One turn of many multi-turn conversations, token in, token out: the hf engine's
        `generate_turns`, with the same prompts (`turn_prompts`)."""
        sampling = sampling_and_rows(sampling, messages, None)
        t0 = time.perf_counter()
        tok = self.tokenizer
        full, appended = turn_prompts(tok, contexts, messages, self.chat)
        prompt_ids, prompt_mask = left_padded(full, tok.pad_token_id)
        params = [self._sampling_params(**kw) for kw in sampling_kwargs(sampling, len(full), seed, tok.eos_token_id)]
        prompts = [turns[-1]["content"] if turns else "" for turns in messages]
        batch = self._sample(full, prompt_ids, prompt_mask, params, prompts, None, sampling, t0)
        batch["appended_ids"] = appended
        batch["context_ids"] = full
        return batch

    def _sample(self, unpadded: list[list[int]], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: list[Any],
                prompts: list[str], rows: list[dict] | None, sampling: SamplingConfig, t0: float) -> Batch:
        """Sample from token-id prompts and build the Batch."""
        tok = self.tokenizer
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in unpadded], params, use_tqdm=False)
        tokens, logprobs = read_outputs(outputs, tok, sampling.stop)
        completion, mask, lps = completion_tensors(tokens, logprobs, tok.pad_token_id)
        tensors = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion,
                   "completion_mask": mask, "logprobs": lps}
        return Batch(
            tensors,
            {"prompt": list(prompts), "completion": decode_completions(tok, completion, mask, sampling.stop),
             "row": rows or [{} for _ in prompts]},
            {"version": self.version, "gen_s": time.perf_counter() - t0, "tokens": int(mask.sum())},
        )

    def _option_logprobs(self, unpadded: list[list[int]], option_letters: list[str]) -> torch.Tensor:
        """Each letter's log-prob after its prompt, read as the prompt log-prob of ``prompt + letter``
        (vLLM computes prompt log-probs from the raw logits, i.e. temperature 1)."""
        tok = self.tokenizer
        requests, where = [], []
        for i, (ids, letters) in enumerate(zip(unpadded, option_letters, strict=True)):
            for j, c in enumerate(letters):
                requests.append({"prompt_token_ids": [*ids, letter_token_id(tok, c)]})
                where.append((i, j))
        params = self._sampling_params(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        width = max((len(x) for x in option_letters), default=0)
        out = torch.full((len(unpadded), width), float("-inf"))
        for (i, j), req, o in zip(where, requests, outputs, strict=True):
            out[i, j] = float(o.prompt_logprobs[-1][req["prompt_token_ids"][-1]].logprob)
        return out

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, update: WeightUpdate) -> int:
        """Install a learner's published weights with the transport that made them; returns the new version."""
        TRANSPORTS.get(update.kind).receive(self, update)
        self.llm.reset_prefix_cache()  # cached KV blocks belong to the old weights
        self.version = update.version
        return self.version

    def install_state(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Full weights by Hugging Face name, copied into the running model in place."""
        self.llm.collective_rpc("troupe_load_weights", args=(list(weights.items()),))

    def install_adapter(self, adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
        """A peft LoRA adapter, merged into the base weights of the modules it adapts."""
        targets = lora_targets(adapter)
        if self._lora_base is None or not set(targets) <= self._lora_base.keys():
            # Merging starts from the base every time, never from the previous merge: keep W0 on the CPU.
            self._lora_base = read_base_weights(self.model_path, targets)
        self.install_state(merge_lora(self._lora_base, adapter, config))

    def install_broadcast(self, manifest: nccl.Manifest) -> None:
        """Full weights broadcast bucket by bucket on the weight-sync group (`init_weight_group` first)."""
        self.llm.collective_rpc("troupe_receive_nccl", args=(manifest,))

    def weight_group_size(self) -> int:
        """vLLM workers of this engine: the ranks it takes in the nccl weight-sync group."""
        return int(self.llm.llm_engine.vllm_config.parallel_config.world_size)

    def init_weight_group(self, address: str, port: int, rank_offset: int, world_size: int,
                          generation: int = 0) -> bool:
        """Join the nccl weight-sync group (at the same time as learner rank 0; see `transport.nccl`)."""
        self.llm.collective_rpc("troupe_init_weight_group", args=(address, port, rank_offset, world_size))
        self.weight_generation = generation
        return True

    def weight_group_generation(self) -> int | None:
        """Which build of the weight-sync group this engine joined; None before (or after a restart)."""
        return getattr(self, "weight_generation", None)

    def weight_group_devices(self) -> list[str]:
        """The CUDA device UUID of each vLLM worker: NCCL refuses two ranks on one device."""
        return [str(u) for u in self.llm.collective_rpc("troupe_device_uuid")]

    def get_version(self) -> int:
        return self.version

    def info(self) -> dict[str, Any]:
        return {"backend": "vllm", "device": "cuda", "version": self.version, "vllm": self.vllm_version,
                "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
                "logprobs": "processed_logprobs", **dataclasses.asdict(SamplingConfig())}


class TroupeWorkerExtension:
    """Methods vLLM mixes into its GPU worker (``worker_extension_cls``), called by name through
    ``LLM.collective_rpc``; ``self`` is the worker. The ``troupe_`` prefix keeps them apart from
    the worker's own methods, which vLLM refuses to shadow."""

    model_runner: Any
    device: Any

    def troupe_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(Hugging Face name, tensor)`` pairs into the running model in place."""
        self.model_runner.model.load_weights(weights=weights)
        return len(weights)

    def troupe_init_weight_group(self, address: str, port: int, rank_offset: int, world_size: int) -> int:
        from vllm.distributed.parallel_state import get_world_group

        rank = get_world_group().rank + rank_offset
        self.troupe_set_weight_group(nccl.init_group(address, port, rank, world_size, self.device))
        return rank

    def troupe_set_weight_group(self, group: Any) -> bool:
        """The communicator `troupe_receive_nccl` receives on (``troupe_init_weight_group`` sets it;
        tests set a stand-in, by name: a callable sent through collective_rpc gets the wrapper)."""
        self.troupe_weight_group = group
        return True

    def troupe_device_uuid(self) -> str:
        return nccl.device_uuid(self.device)

    def troupe_receive_nccl(self, manifest: nccl.Manifest) -> int:
        model = self.model_runner.model
        return nccl.receive(self.troupe_weight_group, manifest, lambda ws: model.load_weights(weights=ws), self.device)
