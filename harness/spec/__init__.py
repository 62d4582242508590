"""What a run is: the specs a suite expands to (model, memory, workload, scheduler, runner and
policy), model geometry, the clock model's vocabulary, the runners' and policies' capabilities,
cell identity, units and the input files they are read from. Imports nothing above it."""
