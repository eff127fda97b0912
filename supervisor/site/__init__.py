"""The site service's parts (issue 24): the node ledger's store; the service, its API and the fleet page to come."""
