"""The job cost (app/serving/job_cost.py): what the default bound admits and what it refuses."""

from app.settings import Limits


def test_the_job_cost_admits_the_page_and_its_lessons_and_refuses_the_lane_hogs():
    """Units of ~14 ms (a batch-1 step of both streams as the page runs it, on a quiet 2-core CPU:
    lab/serving/calibrate_job_cost.py): the page's default run and every lesson fit the default bound
    with room to spare, the longest run and the widest batch fit it; the issue's 67-98 s job does not."""
    from app.serving.job_cost import job_cost

    limit = Limits().max_job_cost
    everyday = {"the page's default": job_cost(1, 34, 48, False), "lesson: batch 4": job_cost(4, 37, 48, False),
                "lesson: the lens": job_cost(1, 34, 48, True)}
    assert max(everyday.values()) <= 0.5 * limit, everyday
    admitted = {"batch 8 x 48": job_cost(8, 42, 48, False), "256 new tokens": job_cost(1, 34, 256, False),
                "a 500-token prompt": job_cost(1, 500, 48, False), "160 with the lens": job_cost(1, 34, 160, True)}
    assert max(admitted.values()) <= limit, admitted
    refused = {"the issue's job": job_cost(8, 768, 256, True), "batch 8 x 256": job_cost(8, 42, 256, False),
               "256 with the lens": job_cost(1, 34, 256, True), "a 2000-token prompt": job_cost(1, 2000, 16, False)}
    assert min(refused.values()) > limit and job_cost(8, 768, 256, True) > 7 * limit, refused
