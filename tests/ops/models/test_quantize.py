"""``kvroute make-model --quantize``: mlx-lm's converter on the tiny model, a folder the
router's tokenizer and mlx-lm both load, and the fidelity measure the quantization bench
reports (KL divergence from float16 grows as the bits shrink)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.cli.main import build_parser
from ops.bench.engines import quantization
from ops.models.quantize import ensure_variant, make_quantized


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    cache = tmp_path_factory.mktemp("models")
    return {b: ensure_variant(b, cache) for b in (16, 8, 4)}


def test_make_model_quantize_writes_a_quantized_folder(tmp_path: Path) -> None:
    out = tmp_path / "q4"
    args = build_parser().parse_args(["make-model", str(out), "--quantize", "4"])
    assert args.func(args) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 64
    assert (out / "tokenizer.json").is_file() and (out / "chat_template.jinja").is_file()


def test_make_model_quantize_refuses_a_folder_with_files(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not empty"):
        make_quantized(tmp_path, 8)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_the_variants_shrink_with_their_bits(variants: dict[int, Path]) -> None:
    size = {b: (p / "model.safetensors").stat().st_size for b, p in variants.items()}
    assert size[16] > size[8] > size[4]
    assert "quantization" not in json.loads((variants[16] / "config.json").read_text())


def test_the_router_tokenizes_a_quantized_folder_as_its_source(variants: dict[int, Path]
                                                               ) -> None:
    from router.prompt.tokenizer import ChatTokenizer

    messages = [{"role": "user", "content": "hello there"}]
    ids = {b: ChatTokenizer(str(p)).render_encode(messages) for b, p in variants.items()}
    assert ids[16] == ids[8] == ids[4] and ids[16]


def test_divergence_from_float16_grows_as_the_bits_shrink(variants: dict[int, Path]) -> None:
    # 2 x 16 positions: CPU MLX's quantized matmul takes ~0.15 s a token here
    same, q8, q4 = (quantization.fidelity(variants[16], variants[b], 2, 16) for b in (16, 8, 4))
    assert same["kl_mean"] == pytest.approx(0.0, abs=1e-6) and same["top1_agreement"] == 1.0
    assert 0.0 < q8["kl_mean"] < q4["kl_mean"]
    assert q8["top1_agreement"] >= q4["top1_agreement"]
    assert q8["positions"] == 2 * 16


def test_the_engine_alone_reports_memory_and_rates(variants: dict[int, Path]) -> None:
    r = quantization.profile(variants[4], "hello " * 8, max_tokens=4)
    assert r["weights_bytes"] < (variants[4] / "model.safetensors").stat().st_size * 1.1
    assert r["peak_memory_bytes"] >= r["weights_bytes"]
    assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["ttft_s"] > 0


def test_bench_engines_takes_quantize() -> None:
    args = build_parser().parse_args(["bench", "engines", "--engine", "mlx", "--quantize",
                                      "8", "4"])
    assert args.quantize == [8, 4]
