from deepspeed.data_efficiency.curriculum_scheduler import CurriculumScheduler  # noqa: F401
