"""The processes a step starts: process groups and their ledger, spawning with bounded output, the
programs `run_command` may run.

Imports only kiro's leaf modules."""
