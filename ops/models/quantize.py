"""Half-precision and quantized copies of a model folder, made by mlx-lm's own converter
(``mlx_lm.convert``: affine quantization, groups of 64 weights, fp16 scales and biases).

    kvroute make-model DIR --quantize 16|8|4

16 is float16 weights, not quantized: the reference the quantized copies are measured
against (``kvroute bench engines --quantize 16 8 4``). The output is an MLX folder that
kvroute's mlx engine and ``mlx_lm.load`` read (its ``config.json`` names the bits); the
tokenizer and chat template come along, so the router serves it as it serves the source.
``ensure_variant(bits)`` keeps one copy of the tiny model per precision in the cache.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

PRECISIONS = {16: "fp16", 8: "q8", 4: "q4"}  # --quantize value -> the variant's label
GROUP_SIZE = 64  # mlx-lm's default; every weight matrix of the tiny model divides by it


def label(bits: int) -> str:
    return PRECISIONS[bits]


def convert(src: Path, out: Path, bits: int, group_size: int = GROUP_SIZE) -> Path:
    """Write ``src`` at ``bits`` (16: float16) into ``out``, which must not exist yet
    (``mlx_lm.convert`` refuses to write into an existing folder)."""
    if bits not in PRECISIONS:
        raise ValueError(f"--quantize is one of {', '.join(map(str, PRECISIONS))}, not {bits}")
    from mlx_lm import convert as mlx_convert

    quantize = bits != 16
    mlx_convert(str(src), str(out), quantize=quantize, dtype="float16",
                q_bits=bits if quantize else None, q_group_size=group_size if quantize else None)
    return out


def ensure_variant(bits: int, cache_dir: Path | None = None) -> Path:
    """The tiny model at ``bits`` in the cache, converted on first use; concurrent callers
    never see a partial folder (converted in a temp folder, then renamed into place)."""
    from ops.models.tiny_model import MODEL_NAME, default_cache_dir, ensure_model

    src = ensure_model(cache_dir)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"{MODEL_NAME}-{label(bits)}"
    if (final / "config.json").is_file():
        return final
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
    try:
        convert(src, work / "model", bits).rename(final)
    except OSError:
        if not (final / "config.json").is_file():  # else another process published first
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def make_quantized(out_dir: Path, bits: int, seed: int = 0, family: str | None = None) -> Path:
    """``kvroute make-model DIR --quantize BITS``: the tiny model written, then converted
    into ``out_dir`` (which may exist if it is empty)."""
    from ops.models.tiny_model import make_model

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"make-model --quantize: {out} is not empty")
    with tempfile.TemporaryDirectory(prefix="kvroute-make-model-") as tmp:
        src = make_model(Path(tmp) / "src", seed=seed, family=family)
        converted = convert(src, Path(tmp) / "out", bits)
        out.mkdir(parents=True, exist_ok=True)
        for item in converted.iterdir():
            shutil.move(str(item), out / item.name)
    return out
