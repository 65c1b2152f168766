import { render, screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { jsonResponse } from '../test/fixtures'
import type { TrackerRun } from '../types'
import { TrackerRuns } from './TrackerRuns'

const runs: TrackerRun[] = [
  { tracker: 'mlflow', status: 'finished', run_id: 'abc', url: 'http://mlflow.example/#/experiments/1/runs/abc', problem: null },
  { tracker: 'tensorboard', status: 'finished', run_id: null, url: null, problem: null },
  { tracker: 'wandb', status: 'unavailable', run_id: null, url: null, problem: 'ValueError: disk full' },
]

describe('TrackerRuns', () => {
  afterEach(() => vi.unstubAllGlobals())

  it('links the MLflow run, points at the artifacts for the TensorBoard files and says why a tracker stopped', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse(runs)))
    render(<TrackerRuns jobId={7} />)
    expect(await screen.findByRole('link', { name: 'Open the run' })).toHaveAttribute('href', runs[0]!.url!)
    expect(screen.getAllByRole('link')).toHaveLength(1) // no route of the trackers' own: the files are artifacts
    expect(screen.getByText('its event files are among the artifacts once the job ends')).toBeInTheDocument()
    expect(screen.queryByText(/offline run is among the artifacts/)).toBeNull() // W&B stopped: no files to look for
    expect(screen.getByText('Stopped logging: ValueError: disk full')).toBeInTheDocument()
    expect(vi.mocked(fetch).mock.calls[0]![0]).toBe('/api/jobs/7/trackers')
  })

  it('shows nothing for a job that chose no tracker', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse([])))
    const { container } = render(<TrackerRuns jobId={7} />)
    await vi.waitFor(() => expect(fetch).toHaveBeenCalled())
    expect(container).toBeEmptyDOMElement()
  })
})
