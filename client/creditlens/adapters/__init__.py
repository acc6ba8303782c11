"""Trainer adapters: ``creditlens.adapters.verl`` (DataProto) and ``creditlens.adapters.trl``
(GRPOTrainer). Each imports its trainer's library only when used."""
