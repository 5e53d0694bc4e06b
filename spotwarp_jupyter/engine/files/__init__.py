"""Workspace files: backup as content-addressed chunks, restore that never writes outside the workspace.

The backup (backup), the workspace at a kernel snapshot's instant (cut), the restore and its checks (restore), the temporaries a restore leaves while it works
(temporaries), `.spotwarpignore` rules (ignore), and where symbolic links lead (link_safety).

May import: storage and the engine's base modules.
"""

from .backup import FileBackupStats, Progress, backup_workspace, files_changed
from .cut import Cut, take_cut
from .ignore import IGNORE_FILE, IgnoreRules
from .restore import FileRestoreReport, UnsafePathError, restore_files

__all__ = [
    "backup_workspace", "Cut", "IGNORE_FILE", "FileBackupStats", "FileRestoreReport", "files_changed", "IgnoreRules", "Progress",
    "restore_files", "take_cut", "UnsafePathError",
]
