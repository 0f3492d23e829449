"""Expert parallelism: mixture-of-experts routing, the MoE layer, all-to-all dispatch and combine."""
