"""Getting human-judgment data onto a machine: download the public files, convert, import.

Three jobs, one theme (turning someone else's file into rows of the sample schema in
``shared/data/README.md``):

* :func:`download_datasets` fetches the human-judgment files that UniEval publishes
  (``maszhongming/UniEval``, ``reproduce/data/...``), converts them with
  :func:`convert_records` and writes ``<task>.jsonl`` into the per-user data dir that
  ``train`` searches (:func:`hdeval.paths.user_data_dir`).
* :func:`data_status` says, per built-in task, where its file is looked for and what is there.
* :func:`import_table` converts a user's CSV/TSV/JSON/JSONL with a column mapping.

Library code: problems are raised as :class:`~hdeval.errors.HdevalError` subclasses and
progress goes through a callback; nothing here prints.
"""

from hdeval.datasets.download import (  # noqa: F401  (the public names)
    DATASETS, DEFAULT_SOURCE_URL, DEFAULT_TIMEOUT, SOURCE_URL_ENV, DownloadError, DownloadEvent,
    DownloadResult, TaskDataStatus, UpstreamDataset, convert_records, data_status, dataset_url,
    data_candidates, download_dataset, download_datasets, is_official_source, load_task,
    resolve_source_url,
)
from hdeval.datasets.table import (  # noqa: F401
    ColumnMap, import_table, parse_score_columns, scored_aspects, write_samples,
)
