"""``trainer export``: a run's deployed policy as a folder that acts without this product.

``onnx_policy`` writes the policy network's deterministic action as ONNX; ``spec`` describes what it
reads and writes (spec.json); ``exporter`` puts them together with ``trainer/shipped/controller.py``
(as controller.py) and proves, by replaying the evaluation through CityLearn, that the folder acts as
the product did (docs/export.md).
"""
