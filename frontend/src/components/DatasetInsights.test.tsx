import { fireEvent, render, screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { jsonResponse } from '../test/fixtures'
import type { Dataset } from '../types'
import { DatasetInsights } from './DatasetInsights'

const dataset = { id: 4, name: 'qa', format: 'alpaca', rows: 3, usable_rows: 3, report: {} } as Dataset

const preview = {
  model: 'builtin/SmolLM2-135M-Instruct', task: 'sft', numbered_by: 'line', offset: 0, total: 3,
  rows: [{ line: 1, sequence: 'completion', tokens: 12, trained_tokens: 4, truncated: false,
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

    // continued pretraining trains on a long row whole, in rows of the max length
    rerender(<DatasetInsights dataset={dataset} model="builtin/SmolLM2-135M-Instruct" maxSeqLen={128} splitsLongRows />)
    expect(screen.getByTestId('truncation')).toHaveTextContent(
      '1 of 3 rows are longer than 128 tokens: each is split into rows of 128, every token trained on.')
  })

  it('says why the chat template refuses a row', async () => {
    const refused = { ...preview, rows: [{ line: 2, sequence: 'completion', tokens: 0, trained_tokens: 0, truncated: false,
      segments: [], refused: 'Conversation roles must alternate' }] }
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (input) =>
      jsonResponse(String(input).includes('/preview') ? refused : stats)))
    render(<DatasetInsights dataset={dataset} model="builtin/SmolLM2-135M-Instruct" maxSeqLen={2048} />)
    expect(await screen.findByRole('article', { name: 'Line 2 completion' })).toHaveTextContent(
      'the chat template refuses it (a job leaves it out): Conversation roles must alternate')
  })

  it('says the preview needs the tokenizer when the server has none (409)', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse({ detail: 'no tokenizer of org/model on this machine' }, 409)))
    render(<DatasetInsights dataset={dataset} model="org/model" maxSeqLen={2048} />)
    expect(await screen.findByText(/needs org\/model’s tokenizer on the server: no tokenizer of org\/model/)).toBeInTheDocument()
  })

  it('while the built-in model is being imported (503), says so and asks again after Retry-After', async () => {
    let calls = 0
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (input) => {
      if (String(input).includes('/preview') && calls++ === 0) {
        return new Response(JSON.stringify({ detail: 'the built-in model is being imported' }),
          { status: 503, headers: { 'Content-Type': 'application/json', 'Retry-After': '1' } })
      }
      return jsonResponse(String(input).includes('/preview') ? preview : stats)
    }))
    render(<DatasetInsights dataset={dataset} model="builtin/SmolLM2-135M-Instruct" maxSeqLen={2048} />)
    expect(await screen.findByText(/the built-in model is being imported/)).toBeInTheDocument()
    expect(await screen.findByText('4.<|im_end|>', { selector: 'mark' }, { timeout: 4000 })).toBeInTheDocument()
    expect(screen.queryByText(/the built-in model is being imported/)).not.toBeInTheDocument()
  })
})

describe('the preview pages through every usable row', () => {
  const sequence = (line: number) => ({ line, sequence: 'completion', tokens: 5, trained_tokens: 2, truncated: false,
    segments: [{ text: `question on line ${line}`, trained: false }, { text: `answer ${line}`, trained: true }] })
  const page = (offset: number, lines: number[]) => ({ ...preview, offset, total: 7, rows: lines.map(sequence) })

  it('names each row by its line in the file and asks for the next page by offset', async () => {
    // usable rows on lines 1, 2, 4 | 6, 7, 9 | 12: lines 3, 5, 8, 10 and 11 are in the report as bad
    const pages: Record<string, unknown> = { 0: page(0, [1, 2, 4]), 3: page(3, [6, 7, 9]), 6: page(6, [12]) }
    const fetchMock = vi.fn<typeof fetch>().mockImplementation(async (input) => {
      const url = new URL(String(input), 'http://studio')
      return jsonResponse(url.pathname.endsWith('/preview') ? pages[url.searchParams.get('offset')!] : stats)
    })
    vi.stubGlobal('fetch', fetchMock)
    render(<DatasetInsights dataset={dataset} model="builtin/SmolLM2-135M-Instruct" maxSeqLen={2048} />)
    expect(await screen.findByRole('article', { name: 'Line 4 completion' })).toHaveTextContent('answer 4')
    expect(screen.getByTestId('preview-range')).toHaveTextContent('Usable rows 1–3 of 7')
    expect(screen.getByRole('button', { name: 'Previous' })).toBeDisabled()

    fireEvent.click(screen.getByRole('button', { name: 'Next' }))
    expect(await screen.findByRole('article', { name: 'Line 9 completion' })).toBeInTheDocument()
    expect(screen.getByTestId('preview-range')).toHaveTextContent('Usable rows 4–6 of 7')
    expect(String(fetchMock.mock.calls.at(-1)![0])).toContain('offset=3')

    fireEvent.change(screen.getByLabelText('From usable row'), { target: { value: '7' } })
    fireEvent.click(screen.getByRole('button', { name: 'Show' }))
    expect(await screen.findByRole('article', { name: 'Line 12 completion' })).toBeInTheDocument()
    expect(screen.getByTestId('preview-range')).toHaveTextContent('Usable rows 7–7 of 7')
    expect(screen.getByRole('button', { name: 'Next' })).toBeDisabled()
    expect(fetchMock.mock.calls.filter(([input]) => String(input).includes('/token-stats'))).toHaveLength(1)
  })
})

