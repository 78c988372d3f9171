"""Numerics alignment: a deployment's logprobs and routing against a local forward pass of the
same weights (the R3 paper's figures), and the pictures of them."""

# The thresholds' defaults, in one place for the suite's ini keys and `rlrollout numerics`.
MAX_KL = 1e-3  # the largest k3 KL of the deployment's logprobs against the local forward pass
MIN_ROUTE_AGREEMENT = 0.99  # NUM-ROUTE-1: the least (layer, token) agreement with the local router
