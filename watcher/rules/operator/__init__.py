"""Pure decisions of the operator's verbs that span a partition's items (rewind). No I/O."""
