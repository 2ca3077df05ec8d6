"""`memwall calc` prints the ledger's two rows, each with its own bound."""

from memwall.cli import main


def test_calc_prints_weight_matmuls_and_attention(capsys):
    assert main(["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--batch", "1024"]) == 0
    out = capsys.readouterr().out
    matmuls = next(line for line in out.splitlines() if "weight matmuls" in line)
    attention = next(line for line in out.splitlines() if line.strip().startswith("attention"))
    assert "compute-bound" in matmuls and "memory-bound" in attention
    assert "each row its own bound" in out
    assert "4 FLOPs/byte" in attention  # Llama 3 8B: 32 query heads over 8 KV heads, bf16
