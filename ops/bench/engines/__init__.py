"""``kvroute bench engines``: the same workload on each engine behind kvroute.

    kvroute bench engines --engine sim mlx [--replicas 2] [--prompt-words 600]
    kvroute bench engines --engine mlx --quantize 16 8 4

``command.py`` holds the options and picks the measurement; ``measure.py`` deploys one
engine and measures it through the router (cold and warm TTFT, tokens/s);
``quantization.py`` runs one mlx model at float16, 8 and 4 bits side by side. Figures are
printed as one table and written as JSON (``--out``).
"""
