"""Measuring tools beside the product (not installed, not in the image): ``python -m benchmarks.bench``,
``python -m benchmarks.bench_e2e``, ``python -m benchmarks.recipe_loop``; run from a source checkout."""
