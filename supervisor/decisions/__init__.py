"""The pure decision core: detectors, classifier, policy, node ledger and the journal vocabulary. No I/O."""
