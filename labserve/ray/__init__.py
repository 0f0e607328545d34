"""labserve on Ray Serve: the Runnable tuned in the lab, on replicas, with the same batching.

An optional extra (``pip install 'labserve[ray]'``): nothing else in labserve imports it.

>>> import ray, labserve, labserve.ray                          # doctest: +SKIP
>>> labserve.ray.init(num_cpus=2)  # ray.init, retried on a start-up timeout  # doctest: +SKIP
>>> app = labserve.ray.deploy(runner, num_replicas=2)            # doctest: +SKIP
"""

from labserve.ray.app import RayApp, deploy
from labserve.ray.cluster import init
from labserve.ray.executor import RayExecutor
from labserve.ray.source import RaySource
from labserve.ray.stats import merge_snapshots

__all__ = ["RayApp", "RayExecutor", "RaySource", "deploy", "init", "merge_snapshots"]
