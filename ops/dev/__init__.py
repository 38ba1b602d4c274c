"""Developer tools, not user commands: run by a maintainer with ``python -m ops.dev.<name>``
(``render_dashboard`` draws the committed dashboard PNG; ``check_rayservice_crd`` checks the
KubeRay manifest against the CRD)."""
