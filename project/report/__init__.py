"""What a run reports: ``results.json``, HPARAMS and the layout (:mod:`~project.report.results`), the TensorBoard
logger (:mod:`~project.report.run_logger`), ``metrics.csv`` (:mod:`~project.report.epoch_metrics`) and the test
figures (:mod:`~project.report.figures`).

The face: the class paths configs name (``project.report.RunTensorBoardLogger``, ...).
"""

from project.report.epoch_metrics import EpochMetrics
from project.report.results import TensorBoardLayout
from project.report.run_logger import RunTensorBoardLogger

__all__ = ["EpochMetrics", "RunTensorBoardLogger", "TensorBoardLayout"]
