"""Command-line tools.

bench.py     the benchmark: `python -m specviz.cli.bench --help`
bench_hf.py  transformers' generate (plain and assisted) for the benchmark's --compare-hf
export.py    a recording as one standalone HTML page: `python -m specviz.export RECORDING -o page.html`
"""
