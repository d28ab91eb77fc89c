"""The MLPerf reference's outputs, made from our Results alone (a pure exporter): its --output fields (output.py,
from fields.py's figures by its names and units and cache_fields.py's cache_stats), its spreadsheet (xlsx.py) and its
console sections with the PASS/FAIL line (reference_console.py). `report RUN --mlperf-output FILE` writes them
for any run.
"""
