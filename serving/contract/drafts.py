"""The one table of draft architectures (DRAFTS) and what each needs; the only place a draft
architecture's name appears, on either side.

A draft declares its architecture in config.json `architectures` (as transformers'
save_pretrained writes it: the class name). What the architecture is made of is read from
here, never guessed from tensor names or shapes: whether it reads target features (taps),
whether every layer has grouped dynamic causal convolutions before attention and before the
MLP (convs), and whether a candidate selector re-scores its top-k proposals (selector). The
runtime builds its draft from these needs and ddops plans from them; an architecture not in
the table is refused by both preflights.

DFlash 2 is z-lab's `dflash` package (0.1.0, dflash/model.py, class DFlash2DraftModel); the
fields it reads are listed in docs/spec.md, "DFlash 2 drafts".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class DraftArch:
    taps: bool      # fc over the target's hidden states at dflash_config.target_layer_ids
    convs: bool     # attention_conv and mlp_conv in every layer (GroupedDynamicCausalConv)
    selector: bool  # candidate_selector: top-k re-scored with predecessor/successor codebooks

    @property
    def keys(self) -> tuple[str, ...]:
        """dflash_config keys the architecture cannot run without (besides the DFlash 1 ones)."""
        return (CONV_KEYS if self.convs else ()) + (SELECTOR_KEYS if self.selector else ())


CONV_KEYS = ("conv_group_size", "conv_kernel_size")
SELECTOR_KEYS = ("selector_rank", "selector_top_k")

DRAFTS: dict[str, DraftArch] = {
    "DFlashDraftModel": DraftArch(taps=True, convs=False, selector=False),
    "DFlash2DraftModel": DraftArch(taps=True, convs=True, selector=True),
}
# A draft config without `architectures` (hand-written DFlash 1 configs predate the field
# in some exports) is read as the DFlash 1 layout, the one every such draft was saved in.
DEFAULT_ARCH = "DFlashDraftModel"


def architecture(draft: Mapping) -> str:
    names = draft.get("architectures") or [DEFAULT_ARCH]
    return str(names[0])


def draft_arch(draft: Mapping) -> DraftArch | None:
    """The table's row for the draft config's architecture; None when the table lacks it."""
    return DRAFTS.get(architecture(draft))


def draft_value(draft: Mapping, key: str, default=None):
    """A DFlash field as the package reads it: dflash_config first, then the top level."""
    nested = draft.get("dflash_config") or {}
    value = nested.get(key)
    return value if value is not None else draft.get(key, default)


def output_scale(draft: Mapping) -> tuple[float, float | None, float]:
    """(output_multiplier, final_logit_softcapping or None, input_embedding_scale): optional
    fields of either architecture; logits = softcap(multiplier * head(h)), where softcap(z) =
    c * tanh(z / c) when c > 0; noise rows = target embedding * input_embedding_scale."""
    cap = draft_value(draft, "final_logit_softcapping")
    cap = float(cap) if cap is not None and float(cap) > 0 else None
    return (float(draft_value(draft, "output_multiplier", 1.0)), cap,
            float(draft_value(draft, "input_embedding_scale", 1.0)))
