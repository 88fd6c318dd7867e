"""Which transformers class a model is and which attention implementation it is built with.

A job's ``--attention`` names what runs on the GPU; the model is built on the meta device with
what this CPU can build: ``eager``, or ``sdpa`` — also for ``flash-attention-2``, whose calls the
simulation runs as FlashAttention-2 runs them (:func:`trainfit.memory.semantics.device_semantics`
patches transformers' sdpa attention function). A class that has no SDPA implementation but
runs flash_attention_2 (Gemma-2, gpt-oss, VaultGemma, T5Gemma: softcapping or attention sinks
torch's SDPA lacks) dispatches its attention through ``ALL_ATTENTION_FUNCTIONS`` by the config's
``_attn_implementation`` at each forward: it is built eager and its config then says ``sdpa``, so
the forward reaches the same patched function (transformers' own ``set_attn_implementation``
switches such classes so: ``_can_set_attn_implementation``). A class whose flash_attention_2 is
an attention module of its own (GPT-J, GPT-Neo, Bark: ``*FlashAttention2``) cannot be built
without the flash-attn package and a GPU: refused, with the plan that errs high.
"""

from __future__ import annotations

from typing import Any

from trainfit.job import JobError, JobSpec
from trainfit.model.source import ModelSource, build_config


def auto_model_class(task: str) -> Any:
    import transformers as tf

    return {
        "causal-lm": tf.AutoModelForCausalLM,
        "seq2seq-lm": tf.AutoModelForSeq2SeqLM,
        "sequence-classification": tf.AutoModelForSequenceClassification,
    }[task]


def model_class(source: ModelSource) -> Any:
    """transformers' class for this model (None: not known without building it — the user's
    own module, remote code)."""
    if source.task == "custom-lm":
        return None
    try:
        return auto_model_class(source.task)._model_mapping[type(build_config(source))]
    except (KeyError, ValueError):
        return None


def has_sdpa(source: ModelSource) -> bool | None:
    """Whether transformers' class for this model implements SDPA attention (None: not known
    without building it)."""
    cls = model_class(source)
    return None if cls is None else bool(getattr(cls, "_supports_sdpa", False))


def check_flash_attention_2(cls: Any, inside: Any = None) -> None:
    """Refuse flash-attention-2 for a model class transformers refuses
    ``attn_implementation="flash_attention_2"`` for (``_supports_flash_attn`` False: T5);
    ``inside``: the composite model class it is a part of."""
    if not getattr(cls, "_supports_flash_attn", True):
        composite = inside is not None and inside is not cls
        part = f" (inside {inside.__name__})" if composite else ""
        hint = "use --attention sdpa (or eager)" if getattr(cls, "_supports_sdpa", False) \
            else "use --attention eager"
        if composite:  # one choice for every part here; transformers also takes one per part
            hint += (" — a script may give transformers a dict per sub-config (flash_attention_2"
                     " for the language model only), which the plan cannot: it errs high")
        raise JobError(f"--attention flash-attention-2: transformers has no flash_attention_2 "
                       f"for {cls.__name__}{part}", hint)


def check_flash_attention_2_built(model: Any) -> None:
    """:func:`check_flash_attention_2` for a built model and every transformers model inside it.
    A string ``attn_implementation`` reaches each sub-config of a composite model (a vision or
    audio tower beside the language model), and each sub-model's ``__init__`` refuses it where
    its class has none (``PreTrainedModel._flash_attn_can_dispatch``): the class looked up before
    the build is only the outer one, and a remote-code class is known only once built."""
    from transformers import PreTrainedModel

    for cls in dict.fromkeys(type(m) for m in model.modules() if isinstance(m, PreTrainedModel)):
        check_flash_attention_2(cls, inside=type(model))


def attention_to_build(job: JobSpec, source: ModelSource) -> tuple[str, str | None]:
    """(``attn_implementation`` the model is built with, the one its config is switched to once
    built, or None) — see the module doc."""
    if job.attention == "eager":
        return "eager", None
    cls = model_class(source)
    if job.attention != "flash-attention-2" or cls is None:
        return "sdpa", None  # an unknown class: built, then checked (check_flash_attention_2)
    check_flash_attention_2(cls)
    if getattr(cls, "_supports_sdpa", False):
        return "sdpa", None
    if cls._can_set_attn_implementation():
        return "eager", "sdpa"
    raise JobError(f"--attention flash-attention-2: transformers runs {cls.__name__}'s "
                   "flash_attention_2 through an attention module of its own, which cannot be "
                   "built without the flash-attn package and a GPU",
                   "plan it with --attention eager (more memory than FlashAttention-2: the plan "
                   "errs high)")
