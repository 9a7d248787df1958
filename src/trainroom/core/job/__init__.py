"""A job: the keepers of one multi-node run (one per node, each under `launch --job`), merged into
one view (nodes, ranks across hosts, the first failure), with job-wide actions (kill every node,
resume every node from one verified step) and the hung-collective report."""
