import { fireEvent, render, screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import type { Job, LlamaCppStatus } from '../types'
import { ExportPanel, savedWeights } from './ExportPanel'
import { HealthContext } from '../health'
import { healthFixture, jsonResponse, llamaCppBuilding } from '../test/fixtures'

const job = {
  id: 5, owner_id: 1, kind: 'train', name: 'full run', method: 'full', model: 'builtin/SmolLM2-135M-Instruct', dataset_id: 1,
  parent_job_id: null, status: 'succeeded', priority: 0, memory_estimate_bytes: null, gpus: 0, worker: null, device: null,
  step: 2, total_steps: 2, error: null, resume_from: null, requeues: 0, created_at: '2026-12-01T12:00:00Z', started_at: null,
  finished_at: '2026-12-01T12:05:00Z', queue_position: null, estimated_start: null, cancel_requested: false, config: {},
} as Job

afterEach(() => vi.unstubAllGlobals())

describe('savedWeights', () => {
  it('prefers the adapter, then the whole model', () => {
    expect(savedWeights([{ kind: 'checkpoint' }, { kind: 'adapter' }, { kind: 'model' }])).toBe('adapter')
    expect(savedWeights([{ kind: 'checkpoint' }, { kind: 'model' }])).toBe('model')
    expect(savedWeights([{ kind: 'checkpoint' }])).toBeNull()
    expect(savedWeights(null)).toBeNull()
  })
})

describe('ExportPanel', () => {
  it('exports a whole model without offering an adapter', async () => {
    const bodies: unknown[] = []
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (_input, init) => {
      bodies.push(JSON.parse(String(init?.body)))
      return jsonResponse({ ...job, id: 6, kind: 'export', status: 'queued' }, 201)
    }))
    const onExported = vi.fn()
    render(<ExportPanel job={job} exports={[]} saved="model" onExported={onExported} />)
    expect(screen.queryByText(/LoRA adapter/)).toBeNull()
    expect(screen.getByText('16-bit model')).toBeTruthy()
    fireEvent.click(screen.getByRole('button', { name: 'Export' }))
    await vi.waitFor(() => expect(onExported).toHaveBeenCalled())
    expect(bodies).toEqual([expect.objectContaining({ adapter: false, merged: true })])
  })

  it('says why a job that saved nothing cannot be exported', () => {
    render(<ExportPanel job={job} exports={[]} saved={null} onExported={() => {}} />)
    expect(screen.getByText(/saved no adapter or model/)).toBeTruthy()
    expect(screen.queryByRole('button', { name: 'Export' })).toBeNull()
  })

  it('says what waits for llama.cpp while it is built, and offers the k-quants once it is ready', () => {
    const panel = (llama_cpp: LlamaCppStatus = llamaCppBuilding) => (
      <HealthContext.Provider value={{ health: healthFixture({ llama_cpp }), error: null, checkedAt: 0 }}>
        <ExportPanel job={job} exports={[]} saved="adapter" onExported={() => {}} />
      </HealthContext.Provider>
    )
    const { rerender } = render(panel())
    expect(screen.getByTestId('llama-cpp-notice')).toHaveTextContent(
      'GGUF k-quants and the check of GGUF files need llama.cppllama.cpp is still being built (since 11:20 UTC); ready in a few minutes.')
    expect(screen.getByRole('checkbox', { name: 'q4_k_m' })).toBeDisabled()
    expect(screen.getByRole('checkbox', { name: 'q8_0' })).toBeEnabled()
    rerender(panel({ state: 'ready', detail: 'llama.cpp is ready.', since: null, log: null }))
    expect(screen.queryByTestId('llama-cpp-notice')).toBeNull()
    expect(screen.getByRole('checkbox', { name: 'q4_k_m' })).toBeEnabled()
  })
})
