"""What a teacher is asked and answers, and the cross-tokenizer rendering its workers run:
below both the policy's workers (nemo_opd.policy) and the teachers (nemo_opd.teachers)."""
