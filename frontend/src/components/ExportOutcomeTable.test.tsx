import { act, render, screen, within } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { FakeSocket, jsonResponse } from '../test/fixtures'
import type { FormatOutcome, Job } from '../types'
import { ExportOutcomeTable } from './ExportOutcomeTable'
import { ExportPanel } from './ExportPanel'

const MEANING = "the merged model's logits differ from the trained model's by more than one rounding of its dtype allows"
const formats: Record<string, FormatOutcome> = {
  adapter: { status: 'unchecked', figures: [] },
  merged: {
    status: 'failed', reason: 'The merged model does not match the trained adapter: max |logit diff| 0.528, above its bound 0.467',
    advice: 'Export the merged model again in float16 (8 times finer rounding), or use the adapter with its base model, which is exact.',
    figures: [
      { figure: 'max |logit diff|', measured: 0.528, bound: 0.467, within: 'at most', passed: false, meaning: MEANING },
      { figure: 'top-1 mismatches (not near-ties)', measured: 0, bound: 0, within: 'at most', passed: true, meaning: 'top-1' },
    ],
  },
  'gguf-q4_k_m': { status: 'not made', reason: 'Not made: GGUF files are converted from the merged model.', figures: [],
    advice: 'Fix the merged model first (its row says why): GGUF files are converted from it.' },
}

afterEach(() => vi.unstubAllGlobals())

describe('ExportOutcomeTable', () => {
  it('shows each format left out with the figure it missed, its bound, what that means and what to do', () => {
    render(<ExportOutcomeTable formats={formats} />)
    const table = screen.getByRole('table', { name: 'Formats left out' })
    const rows = within(table).getAllByRole('row').slice(1)
    expect(rows).toHaveLength(2)  // the merged model's one missed figure and the GGUF not made; the adapter was kept
    const merged = within(rows[0]!).getAllByRole('cell').map((cell) => cell.textContent)
    expect(within(rows[0]!).getByRole('rowheader')).toHaveTextContent('Merged model')
    expect(merged).toEqual(['max |logit diff|', '0.528', '≤ 0.467', MEANING, formats.merged!.advice])
    expect(within(rows[1]!).getByRole('rowheader')).toHaveTextContent('GGUF q4_k_m')
    expect(rows[1]).toHaveTextContent('Fix the merged model first')
  })

  it('shows nothing when every format was kept', () => {
    const { container } = render(<ExportOutcomeTable formats={{ adapter: formats.adapter! }} />)
    expect(container).toBeEmptyDOMElement()
  })
})

describe('a failed export in the export panel', () => {
  it('reads its stream once and shows the table in place of the raw error', async () => {
    FakeSocket.instances = []
    vi.stubGlobal('WebSocket', FakeSocket)
    const failed = {
      id: 8, owner_id: 1, kind: 'export', name: 'export', method: 'export', model: 'builtin/SmolLM2-135M-Instruct',
      dataset_id: null, parent_job_id: 5, sweep_id: null, status: 'failed', priority: 0, memory_estimate_bytes: null, gpus: 0, worker: null, requeues: 0,
      device: null, step: 0, total_steps: null, resume_from: null, created_at: '2026-12-01T12:00:00Z', started_at: null,
      finished_at: '2026-12-01T12:05:00Z', queue_position: null, estimated_start: null, cancel_requested: false,
      config: { export: { adapter: false, merged: true, gguf_types: ['q4_k_m'] } },
      error: 'Export: Nothing of this export passed its check: The merged model does not match the trained adapter: max |logit diff| 0.528, above its bound 0.467',
    } as Job
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (input) =>
      jsonResponse(String(input).endsWith('/artifacts') ? [] : failed)))
    render(<ExportPanel job={{ ...failed, id: 5, kind: 'train', error: null, status: 'succeeded' }} exports={[failed]} saved="adapter" onExported={() => {}} />)
    expect(screen.getByText(/^Export: Nothing of this export/)).toBeInTheDocument()  // until the stream says more
    const socket = FakeSocket.last
    expect(socket.url).toContain('/ws/jobs/8?after=0-0')
    act(() => {
      socket.open()
      socket.receive({ id: '1-0', type: 'verification', data: { formats } })
      socket.receive({ id: '2-0', type: 'status', data: { status: 'failed', error: failed.error } })
    })
    const table = await screen.findByRole('table', { name: 'Formats left out' })
    expect(table).toHaveTextContent('max |logit diff|')
    expect(screen.getByText('Nothing of this export passed its check, so nothing was kept.')).toBeInTheDocument()
    expect(screen.queryByText(/^Export: Nothing of this export/)).toBeNull()
    expect(socket.closed).toBe(true)  // the job is over: its stream is not kept open
  })
})
