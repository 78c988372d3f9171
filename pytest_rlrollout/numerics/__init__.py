"""Numerics alignment: a deployment's logprobs and routing against a local forward pass of the
same weights (the R3 paper's figures), and the pictures of them."""
