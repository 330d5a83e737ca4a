"""NotApplicable: what a report step raises when its section does not apply to the model (faithfulness on an
encoder, a K/V merge of a model with one KV head per layer, healing without a saved result). collect.py records the
section as `unavailable` with the exception's message as the reason; every other exception fails the report."""


class NotApplicable(Exception):
    """This section does not apply to this model (the message says why, in one sentence a page can show)."""
