"""Running troupe on a cluster: launcher and KubeRay configs, their offline checks, job
submission, and a local ``ray start`` cluster for tests.

- ``configs/`` — cluster-launcher YAMLs for ``ray up`` (aws, gcp, local).
- ``kuberay/`` — a ``RayCluster`` and a ``RayJob`` that runs ``troupe run grpo``.
- `troupe.cluster.validate` — offline schema checks and whether a graph's bundles fit a node.
- `troupe.cluster.submit` — submit, follow, stop and list runs over Ray's job API with a token.
- `troupe.cluster.local` — `LocalCluster`, ``ray start --head`` on free ports with token auth.

Importing this package does not import Ray.
"""

from troupe.cluster.local import LocalCluster, LocalClusterError
from troupe.cluster.submit import (
    ClusterAuthError,
    ClusterUnreachableError,
    SubmitError,
    UploadTooLargeError,
    connect,
    submit_main,
    submit_run,
)
from troupe.cluster.validate import (
    ConfigReport,
    InfeasibleBundle,
    check_bundles,
    check_config_file,
    check_kuberay_manifest,
    check_launcher_config,
    infeasible_bundles,
)

__all__ = [
    "ClusterAuthError",
    "ClusterUnreachableError",
    "ConfigReport",
    "InfeasibleBundle",
    "LocalCluster",
    "LocalClusterError",
    "SubmitError",
    "UploadTooLargeError",
    "check_bundles",
    "check_config_file",
    "check_kuberay_manifest",
    "check_launcher_config",
    "connect",
    "infeasible_bundles",
    "submit_main",
    "submit_run",
]
