"""What a run does to a deployment, as library code the pytest suite, the commands and a
trainer's loop all call: the snapshots it swaps in (`snapshots`) and its plan (`plan`)."""
