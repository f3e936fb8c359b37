"""Hugging Face transformers' flex attention on tpu. transformers refuses flex attention when
the host's accelerator is named "tpu" (its check is written for torch_xla, whose TPU tensors
flex attention refuses), and then never imports it. On torchtpu flex attention runs (eager and
compiled), so when transformers' import_utils is first executed its check learns that a tpu
here is torchtpu's."""
import sys

from . import PatchOnImport

MODULE = "transformers.utils.import_utils"


def install():
    if MODULE in sys.modules:
        _flex_attention_available(sys.modules[MODULE])
    else:
        sys.meta_path.insert(0, PatchOnImport(MODULE, _flex_attention_available))


def _flex_attention_available(import_utils):
    check = getattr(import_utils, "is_torch_flex_attn_available", None)
    if check is None or getattr(check, "_torchtpu", False):
        return

    def is_torch_flex_attn_available():
        return import_utils.is_torch_available()

    is_torch_flex_attn_available._torchtpu = True
    import_utils.is_torch_flex_attn_available = is_torch_flex_attn_available
