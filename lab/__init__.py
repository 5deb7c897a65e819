"""The lab: A/B benchmarks, probes, studies, training runs on a lent GPU and one-off measurements
(lab/README.md lists them). The product (model/, app/, app.py, scripts/) never imports it
(tests/project/test_layers.py); a lab tool may import the product and its scripts."""
