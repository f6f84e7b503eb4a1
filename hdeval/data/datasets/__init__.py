"""Getting human-judgment data onto a machine as rows of the sample schema: :func:`download_datasets`
(UniEval's published files), :func:`data_status` (where each built-in task's file is looked for),
:func:`import_table` (a user's CSV/TSV/JSON/JSONL with a column mapping). Nothing here prints."""

from hdeval.data.datasets.download import (  # noqa: F401  (the public names)
    DATASETS,
    DEFAULT_SOURCE_URL,
    DEFAULT_TIMEOUT,
    SOURCE_URL_ENV,
    DownloadError,
    DownloadEvent,
    DownloadResult,
    TaskDataStatus,
    UpstreamDataset,
    convert_records,
    data_candidates,
    data_status,
    dataset_url,
    download_dataset,
    download_datasets,
    is_official_source,
    load_task,
    resolve_source_url,
)
from hdeval.data.datasets.table import (  # noqa: F401
    ColumnMap,
    import_table,
    parse_score_columns,
    scored_aspects,
    write_samples,
)
