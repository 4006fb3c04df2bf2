"""Training: the one loop (:mod:`.train`), a watched run's typed events (:mod:`.watch`) and the
synthetic tasks models learn on (:mod:`.tasks`)."""
