"""One job on several devices, under torch's elastic launcher (what `torchrun` runs): `ranks` is what
the training code asks about its process (rank, world size, agreeing across ranks), `launcher` the
job's process that starts the ranks, `rank_process` one rank's training process."""
