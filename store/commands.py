"""What `walla store ls | verify | rm` use of the store, in one module: the command line (store/cli.py)
imports it once, when a command runs, so `walla store --help` imports neither zarr nor polars."""

from walla.store.features import (  # noqa: F401
    LockedError,
    StoreError,
    list_feature_sets,
    read_feature_set,
    remove_feature_set,
    verify_checksums,
)
from walla.store.files import describe_os_error, read_json  # noqa: F401
from walla.store.listing import dir_size, remove_dir  # noqa: F401
from walla.store.location import as_location, is_remote  # noqa: F401
from walla.store.questions import (  # noqa: F401
    QUESTIONS_DIR,
    question_table_dirs,
    read_question_meta,
    read_question_table,
)
