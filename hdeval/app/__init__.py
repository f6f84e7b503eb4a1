"""The labelling app (``hdeval label``): a local web page that asks a person for the labels that
teach the evaluator most, stores them in ``labels.db`` and re-fits as they come."""
