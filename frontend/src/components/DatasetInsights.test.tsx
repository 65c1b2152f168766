import { render, screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { jsonResponse } from '../test/fixtures'
import type { Dataset } from '../types'
import { DatasetInsights } from './DatasetInsights'

const dataset = { id: 4, name: 'qa', format: 'alpaca', rows: 3, usable_rows: 3, report: {} } as Dataset

const preview = {
  model: 'builtin/SmolLM2-135M-Instruct', task: 'sft',
  rows: [{ row: 1, sequence: 'completion', tokens: 12, trained_tokens: 4, truncated: false,
    segments: [{ text: '<|im_start|>user\nWhat is 2 plus 2?', trained: false }, { text: '4.<|im_end|>', trained: true }] }],
}
const stats = { model: 'builtin/SmolLM2-135M-Instruct', task: 'sft', rows_measured: 3, rows_total: 3, sequences: 3,
  min: 12, max: 300, p50: 14, p95: 300, mean: 108.7, total_tokens: 326, trained_tokens: 40, lengths: [12, 14, 300] }

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('DatasetInsights', () => {
  it('marks the trained tokens and counts the rows the max length cuts, asking one request after the other', async () => {
    const fetchMock = vi.fn<typeof fetch>().mockImplementation(async (input) =>
      jsonResponse(String(input).includes('/preview') ? preview : stats))
    vi.stubGlobal('fetch', fetchMock)
    const { rerender } = render(<DatasetInsights dataset={dataset} model="builtin/SmolLM2-135M-Instruct" maxSeqLen={2048} />)
    expect(await screen.findByText('4.<|im_end|>', { selector: 'mark' })).toBeInTheDocument()
    expect(screen.getByText(/What is 2 plus 2\?/, { selector: 'span' })).toBeInTheDocument()
    expect(await screen.findByTestId('truncation')).toHaveTextContent('All 3 rows fit in 2048 tokens.')
    expect(String(fetchMock.mock.calls[0]![0])).toContain('/api/datasets/4/preview?model=builtin%2FSmolLM2-135M-Instruct&max_seq_len=2048')
    expect(String(fetchMock.mock.calls[1]![0])).toContain('/api/datasets/4/token-stats?')

    rerender(<DatasetInsights dataset={dataset} model="builtin/SmolLM2-135M-Instruct" maxSeqLen={128} />)
    expect(screen.getByTestId('truncation')).toHaveTextContent('1 of 3 rows are longer than 128 tokens and would be cut.')
  })

  it('says the preview needs the tokenizer when the server has none (409)', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse({ detail: 'no tokenizer of org/model on this machine' }, 409)))
    render(<DatasetInsights dataset={dataset} model="org/model" maxSeqLen={2048} />)
    expect(await screen.findByText(/needs org\/model’s tokenizer on the server: no tokenizer of org\/model/)).toBeInTheDocument()
  })
})
