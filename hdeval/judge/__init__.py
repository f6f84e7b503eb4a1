"""Asking the judge: prompt templates, the cell filler and criterion scoring."""
