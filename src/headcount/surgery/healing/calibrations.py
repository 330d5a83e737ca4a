"""The named calibrations a heal can be asked for (`heal --calibration`, every edit command's --heal-calibration):
declared here once, checked and built here.

    CALIBRATIONS                 mixed, prose+source, teacher, teacher-chat, teacher-answers, student-answers
    check_calibration("--calibration", value)       ArgumentError "--calibration: expected one of ..., got VALUE"
    check_stubs_not_evaluated(specs, value, flag)   no --eval problem among the stubs the teacher is asked about
    build_calibration(value, teacher, steps, tokens, world=1, progress=True, cache=False, student=None)
        -> (calibration, stream)

mixed and prose+source are analysis.batches.STREAMS (corpora, drawn by the heal itself); the teacher-* three are
written by the teacher when the heal starts: teacher (its sampled continuations, teacher_text.teacher_texts),
teacher-chat (prose and its answers to the eval's prompt, interleaved, every token a target:
teacher_text.teacher_chat_windows), teacher-answers (its answers alone, one window each, the loss on the answer's
tokens only: answers.teacher_answers). student-answers is written by the edited model itself, the student, when
its heal starts: its own greedy answers to the same stubs, the KL to the teacher on their tokens (on-policy
distillation, Agarwal et al. 2024, "On-Policy Distillation of Language Models": the student is corrected at the
states it visits, a repetition loop included, which the teacher's answers never visit). No torch import at
module level (the commands' --help reads this).
"""

from __future__ import annotations

from headcount.arguments import ArgumentError

STREAM_NAMES = ("mixed", "prose+source")  # analysis.batches.STREAMS' keys (a test holds them equal)
TEACHER = "teacher"
TEACHER_CHAT = "teacher-chat"
TEACHER_ANSWERS = "teacher-answers"
STUDENT_ANSWERS = "student-answers"
# written by a model when the heal starts (the teacher, or for student-answers the edited model)
TEACHER_STREAMS = (TEACHER, TEACHER_CHAT, TEACHER_ANSWERS, STUDENT_ANSWERS)
ASKING = (TEACHER_CHAT, TEACHER_ANSWERS, STUDENT_ANSWERS)  # a model is asked about calibration function stubs
CALIBRATIONS = (*STREAM_NAMES, *TEACHER_STREAMS)
DEFAULT = "mixed"
HELP = ("the calibration stream without --text: mixed (prose + torch/numpy docstrings and comments), prose+source "
        "(prose + the same files' verbatim source: for code models), teacher (the teacher's own sampled "
        "continuations of mixed's calibration prompts), teacher-chat (half prose, half the teacher's greedy answers "
        "to function stubs of the torch/numpy calibration source, asked as --eval asks) or teacher-answers (those "
        "answers alone, one window each, the loss on the answer's tokens only; chosen on the KL of held-aside "
        "answers) or student-answers (the same, the edited model's own answers: the KL at the states it visits, "
        "its loops included). What a teacher writes is kept under $HEADCOUNT_CACHE/teacher and read back for the same teacher "
        "weights")


def check_calibration(flag: str, value) -> str:
    """`value` when it names a calibration; else an ArgumentError under `flag`."""
    if value not in CALIBRATIONS:
        raise ArgumentError(flag, f"expected one of {', '.join(CALIBRATIONS)}, got {value!r}")
    return value


def check_stubs_not_evaluated(specs, value: str, flag: str) -> None:
    """The stubs the teacher is asked about are calibration text too: none may hold an --eval problem."""
    if value in ASKING:
        from headcount.data import function_stubs
        from headcount.surgery.task_scores import check_not_calibrated_on

        check_not_calibrated_on(specs, list(function_stubs()), f"{flag} {value}")


def build_calibration(value: str, teacher, steps: int, tokens: int, *, world: int = 1, progress: bool = True,
                      cache: bool = False, student=None):
    """(calibration, stream) for heal(): the stream's name for a corpus, or what the teacher wrote now (as many
    windows as the heal draws: loop.windows_drawn), with "mixed" as the stream heal() is told of. cache: read
    what this teacher already wrote for the same settings back from $HEADCOUNT_CACHE/teacher, and keep what it
    writes now there (teacher_cache; the commands cache, the library does not unless asked). student: the edited
    model, which writes student-answers (ValueError without it)."""
    check_calibration("calibration", value)
    if value not in TEACHER_STREAMS:
        return value, value
    writer = teacher
    if value == STUDENT_ANSWERS:
        if student is None:
            raise ValueError("student: student-answers are the edited model's own answers; expected the student")
        writer = student

    def build():
        return _teacher_calibration(value, writer, steps, tokens, world=world, progress=progress)

    if cache:  # keyed by the writer's weights: a student's answers are never read back for another student
        from headcount.surgery.healing.teacher_cache import cached_calibration
        return cached_calibration(value, writer, steps, tokens, world, build, progress=progress), DEFAULT
    return build(), DEFAULT


def _teacher_calibration(value: str, teacher, steps: int, tokens: int, *, world: int, progress: bool):
    """What `teacher` (for student-answers, the student) writes for calibration `value` (one of TEACHER_STREAMS)."""
    if value == TEACHER:
        from headcount.surgery.healing.teacher_text import teacher_texts
        return teacher_texts(teacher, tokens, progress=progress)
    from headcount.surgery.healing.loop import windows_drawn

    n = windows_drawn(steps, tokens, world=world)
    if value == TEACHER_CHAT:
        from headcount.surgery.healing.teacher_text import teacher_chat_windows
        return teacher_chat_windows(teacher, n, progress=progress)
    from headcount.surgery.healing.answers import teacher_answers
    answers = teacher_answers(teacher, n, progress=progress)
    if value == STUDENT_ANSWERS:
        from headcount.surgery.healing.masked import MaskedWindows
        return MaskedWindows(answers.ids, answers.mask, name=STUDENT_ANSWERS)
    return answers
